//! The `coconet-hetero` binary on the shipped files and on broken ones.

use std::process::Command;

use coconet_hetero::instances::chain;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coconet-hetero"))
}

fn data(name: &str) -> String {
    format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = bin().args(args).output().expect("run binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plan_prints_plans_cost_and_bottleneck() {
    let (ok, out, err) = run(&[
        "plan",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
    ]);
    assert!(ok, "{err}");
    for needle in [
        "scheduling plan",
        "provisioning plan",
        "throughput:",
        "bottleneck: stage",
        "cost: $",
        "proven optimal",
        "fc1",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
}

#[test]
fn plan_with_throughput_override_and_other_scheduler() {
    let (ok, out, err) = run(&[
        "plan",
        "--model",
        &data("bert-large.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--throughput",
        "1000",
        "--scheduler",
        "greedy",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("required 1000 samples/s") && out.contains("heuristic"),
        "{out}"
    );
}

#[test]
fn compare_prints_every_scheduler() {
    let (ok, out, err) = run(&[
        "compare",
        "--model",
        &data("word2vec-nce.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--budget",
        "50",
    ]);
    assert!(ok, "{err}");
    for s in [
        "dp",
        "exhaustive",
        "greedy",
        "genetic",
        "random",
        "cpu-first",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(s)),
            "missing {s} in\n{out}"
        );
    }
    // The DP row has a zero gap and says its result is proven; heuristics say so.
    let dp = out.lines().find(|l| l.starts_with("dp ")).unwrap();
    assert!(dp.split_whitespace().nth(2) == Some("0.00"), "{dp}");
    assert!(dp.ends_with("proven optimal"), "{dp}");
    let greedy = out.lines().find(|l| l.starts_with("greedy ")).unwrap();
    assert!(greedy.ends_with("heuristic"), "{greedy}");
}

/// `--units best`: the heuristics and exhaustive search in the DP's space of units. On
/// word2vec-NCE under the duration objective the fewest units leave every search 6.6 %
/// above the DP's optimum; with the DP's unit counts exhaustive search proves it and
/// greedy finds it.
#[test]
fn compare_with_the_dps_units_measures_search_alone() {
    let gaps = |units: &str| {
        let (ok, out, err) = run(&[
            "compare",
            "--model",
            &data("word2vec-nce.toml"),
            "--catalog",
            &data("catalog.toml"),
            "--budget",
            "50",
            "--units",
            units,
        ]);
        assert!(ok, "{err}");
        assert!(out.contains(&format!("units {units}")), "{out}");
        let row = |s: &str| {
            let l = out.lines().find(|l| l.starts_with(s)).unwrap().to_string();
            let gap: f64 = l.split_whitespace().nth(2).unwrap().parse().unwrap();
            (gap, l)
        };
        (row("exhaustive "), row("greedy "))
    };
    let ((ex_min, _), (greedy_min, _)) = gaps("min");
    let ((ex, ex_row), (greedy, _)) = gaps("best");
    assert!(ex_min > 1.0 && greedy_min > 1.0, "{ex_min} {greedy_min}");
    assert!(ex == 0.0 && ex_row.ends_with("proven optimal"), "{ex_row}");
    assert_eq!(greedy, 0.0);
}

/// `--cuts best`: greedy prices each assignment at its best cuts (the DP restricted to
/// it). On bert-large at 400 samples/s the optimum is eight H100 stages, one run cut,
/// which greedy reaches only so; with runs merged it stops 15 % above.
#[test]
fn greedy_with_the_dps_cuts_finds_what_runs_merged_cannot() {
    let cost = |cuts: &str| {
        let (ok, out, err) = run(&[
            "plan",
            "--model",
            &data("bert-large.toml"),
            "--catalog",
            &data("catalog.toml"),
            "--throughput",
            "400",
            "--units",
            "best",
            "--cuts",
            cuts,
            "--scheduler",
            "greedy",
        ]);
        assert!(ok, "{err}");
        out.lines()
            .find(|l| l.starts_with("cost: "))
            .unwrap()
            .to_string()
    };
    assert!(
        cost("best").starts_with("cost: $3275.93 "),
        "{}",
        cost("best")
    );
    assert!(
        cost("runs").starts_with("cost: $3771.23 "),
        "{}",
        cost("runs")
    );
}

#[test]
fn pareto_writes_csv_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("front");
    let (ok, out, err) = run(&[
        "pareto",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--from",
        "1e5",
        "--to",
        "1e7",
        "--points",
        "8",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("8 points (8 feasible)"), "{out}");
    let csv = std::fs::read_to_string(prefix.with_extension("csv")).unwrap();
    assert_eq!(csv.lines().count(), 9);
    assert!(csv.lines().skip(1).any(|l| l.contains(",true,")));
    let svg = std::fs::read_to_string(prefix.with_extension("svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<circle"));
}

fn broken(file: &str, text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(file);
    std::fs::write(&p, text).unwrap();
    let s = p.to_str().unwrap().to_string();
    (dir, s)
}

fn model_with(layer_extra: &str) -> String {
    format!(
        "name = \"m\"\nbatch_size = 8\n[constraint]\nthroughput = 10.0\nsamples = 100.0\n\n[[layers]]\nname = \"a\"\nkind = \"fc\"\nactivation_bytes = 10\n{layer_extra}\n"
    )
}

#[test]
fn unknown_resource_name_points_at_the_line() {
    let (_d, m) = broken(
        "m.toml",
        &model_with("[layers.time]\ncpu-c6i = 0.1\nt4 = 0.1\nv100 = 0.1\na100 = 0.1\ntpu9 = 0.1"),
    );
    let (ok, _, err) = run(&["plan", "--model", &m, "--catalog", &data("catalog.toml")]);
    assert!(!ok);
    assert!(
        err.contains("m.toml:16:") && err.contains("unknown resource type `tpu9`"),
        "{err}"
    );
}

#[test]
fn missing_profile_is_an_error() {
    let (_d, m) = broken("m.toml", &model_with("[layers.time]\ncpu-c6i = 0.1"));
    let (ok, _, err) = run(&["plan", "--model", &m, "--catalog", &data("catalog.toml")]);
    assert!(!ok);
    assert!(
        err.contains("m.toml:7:") && err.contains("no profile for resource type `t4`"),
        "{err}"
    );
}

#[test]
fn negative_value_is_an_error() {
    let (_d, m) = broken("m.toml", &model_with("flops = -5.0\nbytes = 1.0"));
    let (ok, _, err) = run(&["plan", "--model", &m, "--catalog", &data("catalog.toml")]);
    assert!(!ok);
    assert!(
        err.contains("m.toml:7:") && err.contains("flops must be finite and >= 0, got -5"),
        "{err}"
    );
}

#[test]
fn syntax_error_and_missing_field_have_lines() {
    let (_d, m) = broken(
        "m.toml",
        "name = \"m\"\nbatch_size = 8\n[[layers]]\nname = \"a\"\nkind = \"fc\"\n",
    );
    let (ok, _, err) = run(&["plan", "--model", &m, "--catalog", &data("catalog.toml")]);
    assert!(!ok);
    assert!(
        err.contains("m.toml:") && err.contains("activation_bytes"),
        "{err}"
    );
    let (_d2, c) = broken(
        "c.toml",
        "[[types]]\nname = \"x\"\nclass = \"cpu\"\nprice_per_hour = = 1\n",
    );
    let (ok, _, err) = run(&["plan", "--model", &data("ctr-dnn.toml"), "--catalog", &c]);
    assert!(!ok);
    assert!(err.contains("c.toml:4:"), "{err}");
}

#[test]
fn impossible_constraints_are_reported() {
    let plan = |x: &str| {
        run(&[
            "plan",
            "--model",
            &data("ctr-dnn.toml"),
            "--catalog",
            &data("catalog.toml"),
            "--throughput",
            x,
        ])
    };
    // A negative number is a value (no `=` needed), refused by the constraint's check.
    let (ok, _, err) = plan("-3");
    assert!(
        !ok && err.contains("throughput must be > 0") && err.contains("-3"),
        "{err}"
    );
    // Beyond what the caps allow: infeasible, with the reason (here the parameter
    // server's shards alone break the CPU type's cap).
    let (ok, _, err) = plan("1e12");
    assert!(
        !ok && err.contains("no feasible plan")
            && err.contains("parameter server")
            && err.contains("type cpu-c6i, which has 512"),
        "{err}"
    );
    // Beyond the unit limit: printed as a rate, the limit named, caps not blamed.
    let (ok, _, err) = plan("1e30");
    assert!(!ok, "{err}");
    assert!(
        err.contains("1.0000e30") && err.contains("more than 2^40 shards"),
        "{err}"
    );
    assert!(!err.contains("availability caps"), "{err}");
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("nope.toml"),
        "--catalog",
        &data("catalog.toml"),
    ]);
    assert!(!ok && err.contains("cannot read"), "{err}");
}

#[test]
fn epochs_times_dataset_size_sets_the_volume() {
    let args = [
        "plan",
        "--model",
        &data("word2vec-nce.toml"),
        "--catalog",
        &data("catalog.toml"),
    ];
    let (ok, out, err) = run(&[&args[..], &["--epochs", "4", "--dataset-size", "2.5e8"]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("1.0000e9 samples"), "{out}");
    let (ok, _, err) = run(&[&args[..], &["--epochs", "4"]].concat());
    assert!(
        !ok && err.contains("both --epochs and --dataset-size"),
        "{err}"
    );
}

#[test]
fn model_without_constraint_needs_flags() {
    let text = std::fs::read_to_string(data("word2vec-nce.toml")).unwrap();
    let start = text.find("[constraint]").unwrap();
    let end = text.find("[[layers]]").unwrap();
    let (_d, m) = broken("m.toml", &format!("{}{}", &text[..start], &text[end..]));
    let (ok, _, err) = run(&["plan", "--model", &m, "--catalog", &data("catalog.toml")]);
    assert!(!ok && err.contains("no [constraint]"), "{err}");
    let (ok, out, err) = run(&[
        "plan",
        "--model",
        &m,
        "--catalog",
        &data("catalog.toml"),
        "--throughput",
        "1e5",
        "--samples",
        "1e9",
    ]);
    assert!(ok && out.contains("required 100000 samples/s"), "{err}");
}

#[test]
fn the_dp_takes_a_time_limit_and_refuses_a_negative_one() {
    let plan = |limit: &str| {
        run(&[
            "plan",
            "--model",
            &data("gpt-96.toml"),
            "--catalog",
            &data("catalog.toml"),
            "--throughput",
            "145",
            "--objective",
            "required-rate",
            "--time-limit",
            limit,
        ])
    };
    let (ok, out, err) = plan("0");
    assert!(ok && out.contains("proven optimal"), "{out}{err}");
    let (ok, _, err) = plan("-1");
    assert!(
        !ok && err.contains("`-1` is not a number of seconds"),
        "{err}"
    );
}

#[test]
fn unknown_scheduler_lists_the_known_ones() {
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--scheduler",
        "magic",
    ]);
    assert!(
        !ok && err.contains("unknown scheduler `magic`") && err.contains("bayes"),
        "{err}"
    );
}

#[test]
fn the_papers_objective_is_the_default_and_the_other_selectable() {
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan".to_string(),
            "--model".into(),
            data("word2vec-nce.toml"),
            "--catalog".into(),
            data("catalog.toml"),
            "--throughput".into(),
            "1e5".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    };
    // The paper's objective: CPU servers and a parameter server large enough to finish
    // at 4.4e7 samples/s cost less than two T4s fed at the required 1e5.
    let (ok, out, err) = plan(&[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("cpu-c6i") && out.contains("cost: $7.089 (for the job's duration"),
        "{out}"
    );
    let (ok, out, err) = plan(&["--objective", "required-rate"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("t4") && out.contains("cost: $17.81 (fed at the required throughput)"),
        "{out}"
    );
}

/// `--rental`: the "1 × A100 + 1 × H100" cannot be bought. Per unit it is
/// BERT-large's optimum at 400 sequences/s; by whole instances (the default) the plan
/// moves to T4s, rented singly, and the report says what is rented.
#[test]
fn rental_switch_prices_units_or_whole_instances() {
    let args = |rental: &'static str| {
        let mut a = vec![
            "plan".to_string(),
            "--model".into(),
            data("bert-large.toml"),
            "--catalog".into(),
            data("catalog.toml"),
            "--throughput".into(),
            "400".into(),
            "--objective".into(),
            "required-rate".into(),
        ];
        if !rental.is_empty() {
            a.extend(["--rental".to_string(), rental.to_string()]);
        }
        a
    };
    let go = |rental| {
        let a = args(rental);
        run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (ok, units, err) = go("units");
    assert!(ok, "{err}");
    assert!(
        units.contains("cost: $2913.07") && !units.contains("rented (whole instances"),
        "{units}"
    );
    let (ok, default, err) = go("");
    assert!(ok, "{err}");
    let (_, instances, _) = go("instances");
    assert_eq!(default, instances);
    assert!(
        instances.contains("cost: $3740.44") && instances.contains("proven optimal"),
        "{instances}"
    );
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("bert-large.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--rental",
        "gpus",
    ]);
    assert!(!ok && err.contains("gpus"), "{err}");
}

#[test]
fn per_type_batches_are_shown_and_bad_ones_refused() {
    let base = [
        "plan",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--throughput",
        "2e7",
    ];
    let (ok, out, err) = run(&[&base[..], &["--batch-size", "t4=4096"]].concat());
    assert!(ok, "{err}");
    assert!(out.contains("     batch   s/batch"), "{out}");
    assert!(
        out.contains("cost model: the job's duration (the paper's), whole instances, parameter-server shards, batches t4 4096 (model 512)"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains(" t4 ") && l.contains(" 4096 ")),
        "{out}"
    );
    for (flag, arg, want) in [
        (
            "--batch-size",
            "t4",
            "--batch-size wants TYPE=VALUE, got `t4`",
        ),
        (
            "--batch-size",
            "tpu=8",
            "--batch-size: unknown resource type `tpu` (known: cpu-c6i, t4",
        ),
        (
            "--batch-size",
            "t4=0",
            "the value must be a number > 0, got `0`",
        ),
        (
            "--data-bandwidth",
            "t4=x",
            "the value must be a number > 0, got `x`",
        ),
        (
            "--link-latency-us",
            "-3",
            "--link-latency-us must be a number >= 0, not -3",
        ),
    ] {
        let (ok, _, err) = run(&[&base[..], &[flag, arg]].concat());
        assert!(!ok && err.contains(want), "{flag} {arg}: {err}");
    }
}

#[test]
fn a_missing_rl_policy_is_named() {
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--scheduler",
        "rl",
        "--rl-policy",
        "/nonexistent/policy.safetensors",
    ]);
    assert!(
        !ok && err.contains("rl: reading the policy /nonexistent/policy.safetensors"),
        "{err}"
    );
}

/// A small job's cost and times keep their digits (issue 49: `cost: $0.00`, `wall time
/// 0.00 h`): money to four significant digits, a time in the unit that suits it.
#[test]
fn small_jobs_show_their_cost_and_time_in_digits_that_differ() {
    let (ok, out, err) = run(&[
        "plan",
        "--model",
        &data("ctr-dnn.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--throughput",
        "10",
        "--samples",
        "1000",
    ]);
    assert!(ok, "{err}");
    for needle in [
        "price: $1.886/hour, wall time 0.002047 s (billed 60.00 s, the catalogue's minimum)",
        "cost: $0.03143 (for the job's duration",
        "rows for 7.5120e5 samples/s, $1.360/hour",
        "price/hour",
        " $0.5260  <- bottleneck",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in\n{out}");
    }
}

/// Without a proven optimum `compare` shows every gap against the lower bound dp proved
/// and says so (issue 49: it blanked them all).
#[test]
fn compare_without_a_proven_optimum_gaps_against_a_lower_bound() {
    let (ok, out, err) = run(&[
        "compare",
        "--model",
        &data("bert-large.toml"),
        "--catalog",
        &data("catalog.toml"),
        "--budget",
        "20",
        "--time-limit",
        "1e-9",
    ]);
    assert!(ok, "{err}");
    let header = out.lines().find(|l| l.starts_with("scheduler")).unwrap();
    assert!(header.contains("gap % LB"), "{out}");
    assert!(
        out.contains("(gap % LB: gap % of a lower bound on the optimum ($")
            && out.contains("each plan's real gap to the optimum is at most the one shown"),
        "{out}"
    );
    // dp's gap is the one its status states; every plan has one, none below the bound.
    let dp = out.lines().find(|l| l.starts_with("dp ")).unwrap();
    let gap = dp.split_whitespace().nth(2).unwrap();
    assert!(dp.contains("not guaranteed"), "{dp}");
    assert!(dp.contains(&format!("within {gap} %")), "{dp}");
    for row in ["dp ", "greedy ", "genetic ", "cpu-first "] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap();
        let cost = line.split_whitespace().nth(1).unwrap();
        assert!(cost.starts_with('$'), "{line}");
        let gap: f64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| panic!("no gap in {line}"));
        assert!(gap >= 0.0, "{line}");
    }
}

/// A model given as the catalogue (and a catalogue as the model) is called what it is,
/// with the flag it goes with.
#[test]
fn swapped_inputs_are_named() {
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("catalog.toml"),
        "--catalog",
        &data("ctr-dnn.toml"),
    ]);
    assert!(
        !ok && err.contains("ctr-dnn.toml: this looks like a model file, not a catalogue")
            && err.contains("give it with --model, and a catalogue with --catalog"),
        "{err}"
    );
    let (ok, _, err) = run(&[
        "plan",
        "--model",
        &data("catalog.toml"),
        "--catalog",
        &data("catalog.toml"),
    ]);
    assert!(
        !ok && err.contains("catalog.toml: this looks like a catalogue, not a model file")
            && err.contains("give it with --catalog, and a model file with --model"),
        "{err}"
    );
}

/// A requirement no plan meets is an error that names the most a plan reaches — and
/// asking for that is planned, while a little more is not.
#[test]
fn an_unreachable_requirement_names_the_most_a_plan_reaches() {
    let (model, catalog) = (data("bert-large.toml"), data("catalog.toml"));
    let plan = |x: &str| {
        run(&[
            "plan",
            "--model",
            &model,
            "--catalog",
            &catalog,
            "--throughput",
            x,
            "--objective",
            "required-rate",
            // The work limit alone: the same answer on a loaded machine.
            "--time-limit",
            "0",
        ])
    };
    let (ok, _, err) = plan("1e12");
    assert!(!ok, "{err}");
    let most = err
        .split("the most any plan reaches is ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no reachable throughput named: {err}"));
    let most: f64 = most.parse().unwrap();
    let (ok, out, err) = plan(&most.to_string());
    assert!(ok, "{most} samples/s was named reachable: {out}{err}");
    let (ok, _, err) = plan(&(most * 1.01).to_string());
    assert!(!ok && err.contains("no feasible plan"), "{err}");
}

/// The work limit is a count, so a run stopped by it prints the same plan, bound and
/// status every time; bad values are refused naming the flag's rule.
#[test]
fn a_work_limit_gives_the_same_answer_every_time() {
    let plan = |limit: &str| {
        run(&[
            "plan",
            "--model",
            &data("gpt-96.toml"),
            "--catalog",
            &data("catalog.toml"),
            "--work-limit",
            limit,
            "--time-limit",
            "0",
        ])
    };
    let (ok, once, err) = plan("1e6");
    assert!(ok, "{err}");
    assert!(
        once.contains("not guaranteed")
            && once.contains("work limit ran out")
            && once.contains("of a lower bound"),
        "{once}"
    );
    let (ok, again, err) = plan("1e6");
    assert!(ok, "{err}");
    assert_eq!(once, again);
    for bad in ["-1", "1.5", "lots"] {
        let (ok, _, err) = plan(bad);
        assert!(
            !ok && err.contains(&format!("`{bad}` is not a whole number of work units")),
            "{bad}: {err}"
        );
    }
}

/// SIGINT stops the DP's search: the best plan found so far is printed with the bound it
/// proved and the gap to it, and the planner exits with 128 + 2.
#[cfg(unix)]
#[test]
fn sigint_prints_the_best_plan_so_far_with_its_bound() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let (model, catalog) = (
        dir.path().join("model.toml"),
        dir.path().join("catalog.toml"),
    );
    // Thousands of throughput steps to prove, the first plan after one.
    std::fs::write(&model, chain::model_toml(3000)).unwrap();
    std::fs::write(&catalog, chain::CATALOG).unwrap();
    let mut child = bin()
        .args(["plan", "--model"])
        .arg(&model)
        .arg("--catalog")
        .arg(&catalog)
        .args(["--work-limit", "0", "--time-limit", "0", "--progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run binary");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        seen += &line;
        seen += "\n";
        if line.contains("dp: a plan at") {
            break;
        }
    }
    assert!(seen.contains("dp: a plan at"), "no plan announced: {seen}");
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    // Drain stderr beside stdout, so that neither pipe fills.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let out = child.wait_with_output().expect("wait");
    let rest = rest.join().expect("stderr reader").join("\n");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}{rest}");
    for needle in [
        "scheduling plan",
        "cost: $",
        "not guaranteed",
        "interrupted (SIGINT)",
        "of a lower bound",
    ] {
        assert!(stdout.contains(needle), "no `{needle}` in {stdout}");
    }
    assert!(rest.contains("stopped by signal 2"), "{rest}");
}
