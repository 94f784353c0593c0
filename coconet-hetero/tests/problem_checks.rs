//! A model and catalogue built in code that do not fit together are an error naming
//! what does not fit, not a panic deep in the planner.

mod common;

use coconet_hetero::{Host, InputError, ParameterServer, Problem};
use common::two_layers;

fn parts() -> (
    coconet_hetero::Model,
    coconet_hetero::Catalog,
    coconet_hetero::Constraint,
) {
    let pb = two_layers(
        [[4.0, 1.0, 2.0], [3.0, 2.0, 3.0]],
        [1.0, 2.0, 5.0],
        [None, None, None],
        40.0,
    );
    (pb.model, pb.catalog, pb.constraint)
}

fn refused(
    model: coconet_hetero::Model,
    catalog: coconet_hetero::Catalog,
    constraint: coconet_hetero::Constraint,
    names: &str,
) {
    match Problem::try_new(model, catalog, constraint) {
        Err(InputError::Inconsistent(why)) => assert!(why.contains(names), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted a problem whose {names} does not fit"),
    }
}

#[test]
fn sizes_and_indices_that_do_not_fit_are_named() {
    let (model, catalog, constraint) = parts();
    assert!(Problem::try_new(model.clone(), catalog.clone(), constraint).is_ok());

    let mut short = catalog.clone();
    short.bandwidth.pop();
    refused(model.clone(), short, constraint, "bandwidth matrix");

    let mut hosted = catalog.clone();
    hosted.hosts.push(Host {
        name: "box".into(),
        cores: 8,
        threads: vec![1, 1],
    });
    refused(model.clone(), hosted, constraint, "host `box`");

    let mut served = catalog.clone();
    served.parameter_server = Some(ParameterServer {
        ty: 7,
        bandwidth: 1e9,
    });
    refused(model.clone(), served, constraint, "parameter server");

    let mut other = model;
    other.layers[1].time.pop();
    refused(other, catalog, constraint, "layer `l1`");
}
