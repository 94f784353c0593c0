//! The shipped inputs load, and the exact DP plans them.

use coconet_hetero::schedulers::{Dp, Optimality, Scheduler, SearchConfig};

const MODELS: [&str; 5] = [
    "ctr-dnn",
    "two-tower",
    "word2vec-nce",
    "bert-large",
    "gpt-96",
];

fn data(name: &str) -> String {
    format!("{}/data/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn shipped_models_load_and_plan() {
    for m in MODELS {
        let pb = coconet_hetero::load(data(m), data("catalog"), None).unwrap();
        let out = Dp::default()
            .schedule(&pb, &SearchConfig::default())
            .unwrap();
        assert_eq!(out.optimality, Optimality::Proven);
        assert!(out.evaluation.throughput >= pb.constraint.throughput);
        assert!(out.evaluation.cost > 0.0);
        let names: Vec<String> = out
            .evaluation
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{}..{}:{}x{}",
                    s.stage.first, s.stage.last, pb.catalog.types[s.stage.ty].name, s.units
                )
            })
            .collect();
        eprintln!("{m}: ${:.2} {names:?}", out.evaluation.cost);
    }
}

#[test]
fn ctr_dnn_matches_paddlerec_shape() {
    let pb = coconet_hetero::load(data("ctr-dnn"), data("catalog"), None).unwrap();
    let layers = &pb.model.layers;
    assert_eq!(layers.len(), 6);
    assert_eq!(layers[0].sparse_param_bytes, 1_000_001.0 * 9.0 * 4.0);
    assert_eq!(
        layers[0].activation_bytes,
        512.0 * (26.0 * 9.0 + 13.0) * 4.0
    );
    let widths: Vec<f64> = layers[1..]
        .iter()
        .map(|l| l.activation_bytes / (512.0 * 4.0))
        .collect();
    assert_eq!(widths, vec![512.0, 256.0, 128.0, 32.0, 2.0]);
    assert_eq!(pb.catalog.len(), 5);
}

/// The 98-layer GPT near and past what the caps allow: the label search used to stop at
/// its budget from 200 sequences/s on ("no plan found and none proven impossible"), and
/// under the paper's objective every search probed such throughputs and ended "not
/// guaranteed" (within 23–31 % of a floor). A weighted sum of the caps now proves 300
/// sequences/s out of reach, and the paper's objective at the file's 40 sequences/s is
/// solved exactly.
#[test]
fn gpt_past_its_caps_is_proven_out_of_reach() {
    use coconet_hetero::{Constraint, Objective, PlanError, Rental};
    let pb = coconet_hetero::load(data("gpt-96"), data("catalog"), None).unwrap();
    let cfg = SearchConfig {
        time_limit: None,
        ..SearchConfig::default()
    };
    let past = pb.with_constraint(Constraint::new(300.0, pb.constraint.samples).unwrap());
    match Dp::default().schedule(&past, &cfg) {
        Err(PlanError::NoFeasiblePlan(why)) => assert!(why.contains("weighted sum"), "{why}"),
        other => panic!("expected a proof that 300 seq/s is out of reach, got {other:?}"),
    }
    let paper = pb
        .with_objective(Objective::Duration)
        .with_rental(Rental::Units);
    let out = Dp::default().schedule(&paper, &cfg).unwrap();
    assert_eq!(out.optimality, Optimality::Proven);
    assert!(out.evaluation.throughput >= paper.constraint.throughput);
}
