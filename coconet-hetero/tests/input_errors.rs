//! Input files that are wrong in small ways are refused with a message that names the
//! file and the thing (issue 49): a model given as the catalogue and the reverse, a
//! type entry missing a field, two layers of one name, an absurd batch size.

use std::path::Path;

use coconet_hetero::batch::MAX_BATCH_SIZE;
use coconet_hetero::{Catalog, InputError, Model};

/// A catalogue of two types.
const CATALOGUE: &str = "\
default_bandwidth_gbs = 1
billing_minimum_s = 60

[[types]]
name = \"cpu\"
class = \"cpu\"
price_per_hour = 1.0
memory_gib = 8
peak_tflops = 1
mem_bandwidth_gbs = 100
sync_bandwidth_gbs = 1

[[types]]
name = \"gpu\"
class = \"gpu\"
price_per_hour = 3.0
memory_gib = 16
peak_tflops = 100
mem_bandwidth_gbs = 1000
sync_bandwidth_gbs = 10
";

/// A model of `layers` (names), each with an analytic profile, at `batch`.
fn model(batch: &str, layers: &[&str]) -> String {
    let mut m = format!(
        "name = \"m\"\nbatch_size = {batch}\n\n[constraint]\nthroughput = 10\nsamples = 100\n"
    );
    for l in layers {
        m += &format!(
            "\n[[layers]]\nname = \"{l}\"\nkind = \"fc\"\nflops = 1e9\nbytes = 1e6\nactivation_bytes = 8\n"
        );
    }
    m
}

fn catalogue() -> Catalog {
    Catalog::parse(Path::new("c.toml"), CATALOGUE).expect("the test's catalogue")
}

fn model_error(text: &str) -> String {
    Model::parse(Path::new("m.toml"), text, &catalogue())
        .expect_err("a model that must be refused")
        .to_string()
}

#[test]
fn a_model_file_given_as_the_catalogue_is_called_one() {
    let text = model("8", &["a", "b"]);
    let e = Catalog::parse(Path::new("m.toml"), &text).unwrap_err();
    assert!(
        matches!(
            e,
            InputError::WrongKind {
                found: "model file",
                expected: "catalogue",
                ..
            }
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.starts_with("m.toml: this looks like a model file, not a catalogue")
            && e.contains("`layers`")
            && e.contains("`batch_size`"),
        "{e}"
    );
    // From a file, the same (the file named).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.toml");
    std::fs::write(&path, &text).unwrap();
    let e = Catalog::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("model.toml: this looks like a model file, not a catalogue"),
        "{e}"
    );
}

#[test]
fn a_catalogue_given_as_the_model_is_called_one() {
    let e = model_error(CATALOGUE);
    assert!(
        e.starts_with("m.toml: this looks like a catalogue, not a model file")
            && e.contains("`types`")
            && e.contains("`default_bandwidth_gbs`"),
        "{e}"
    );
}

/// A file with neither kind's keys, or with some of both, keeps the schema's own error.
#[test]
fn only_a_file_of_the_other_kind_is_called_one() {
    let e = Catalog::parse(Path::new("c.toml"), "colour = \"red\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `colour`"), "{e}");
    // A catalogue with a stray model key is still a broken catalogue.
    let e = Catalog::parse(Path::new("c.toml"), &format!("batch_size = 8\n{CATALOGUE}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `batch_size`"), "{e}");
    // Not TOML at all.
    let e = Catalog::parse(Path::new("c.toml"), "[[types]\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("c.toml:1:") && !e.contains("looks like"),
        "{e}"
    );
}

#[test]
fn a_field_missing_from_a_type_names_the_type_and_the_file() {
    let text = CATALOGUE.replace("price_per_hour = 3.0\n", "");
    let e = Catalog::parse(Path::new("c.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("c.toml:13:") && e.contains("type `gpu`: missing field `price_per_hour`"),
        "{e}"
    );
    // Another error inside an entry: the type named too.
    let text = CATALOGUE.replace("class = \"cpu\"", "class = \"tpu\"");
    let e = Catalog::parse(Path::new("c.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("c.toml:6:") && e.contains("type `cpu`: unknown variant `tpu`"),
        "{e}"
    );
    // A type without a name is counted.
    let text = CATALOGUE.replace("name = \"gpu\"\n", "");
    let e = Catalog::parse(Path::new("c.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("type number 2 (it has no name): missing field `name`"),
        "{e}"
    );
    // A layer missing a field is named the same way.
    let text = model("8", &["a", "b"]).replacen("activation_bytes = 8\n", "", 1);
    let e = model_error(&text);
    assert!(
        e.contains("layer `a`: missing field `activation_bytes`"),
        "{e}"
    );
}

#[test]
fn two_layers_of_one_name_are_refused_naming_it() {
    let e = model_error(&model("8", &["embed", "fc", "embed"]));
    assert!(
        e.starts_with("m.toml:") && e.contains("two layers are named `embed`"),
        "{e}"
    );
    assert!(Model::parse(Path::new("m.toml"), &model("8", &["a", "b"]), &catalogue()).is_ok());
}

/// `batch_size = 2^64 - 1` was accepted and planned 1.76e22 samples/s: a batch is at
/// most 2^32 samples, in the model and per type.
#[test]
fn absurd_batch_sizes_are_refused() {
    assert_eq!(MAX_BATCH_SIZE, (1u64 << 32) as f64);
    for absurd in ["18446744073709551615", "4294967297", "1e300"] {
        let e = model_error(&model(absurd, &["a"]));
        assert!(
            e.starts_with("m.toml:")
                && e.contains("batch_size must be at most 2^32 = 4294967296 samples per batch"),
            "{absurd}: {e}"
        );
    }
    let largest = Model::parse(
        Path::new("m.toml"),
        &model("4294967296", &["a"]),
        &catalogue(),
    )
    .expect("2^32 itself is a batch");
    assert_eq!(largest.batch_size, MAX_BATCH_SIZE);
    // A type's own batch too, naming it and its line.
    let text = model("8", &["a"]).replace(
        "\n[constraint]",
        "\n[batch_sizes]\ngpu = 1e12\n\n[constraint]",
    );
    let e = model_error(&text);
    assert!(
        e.starts_with("m.toml:5:") && e.contains("batch_sizes.gpu must be at most 2^32"),
        "{e}"
    );
    // And a model built in code.
    let mut m = largest;
    m.batch_size = 1e20;
    let e = coconet_hetero::Problem::try_new(
        m,
        catalogue(),
        coconet_hetero::Constraint::new(10.0, 100.0).unwrap(),
    )
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("the model's batch size must be > 0 and at most 2^32"),
        "{e}"
    );
}
