//! The parameter server across processes (here: servers and workers on threads, talking
//! TCP on loopback exactly as processes would): synchronous steps give bitwise the rows
//! of one in-process table, and failures are errors naming the server or the worker.

use coconet_heterps::data::{
    EmbeddingTable, ParamServer, ParamServerConfig, PsServer, RemoteTable,
};
use coconet_trust::JobSecret;
use std::sync::OnceLock;
use std::time::Duration;

/// The job secret of every server and worker in this file.
fn secret() -> &'static JobSecret {
    static SECRET: OnceLock<JobSecret> = OnceLock::new();
    SECRET.get_or_init(|| JobSecret::generate().unwrap())
}

const DIM: usize = 3;
const WORKERS: usize = 3;

fn config() -> ParamServerConfig {
    ParamServerConfig {
        dim: DIM,
        seed: 5,
        shards: 2,
        ..ParamServerConfig::default()
    }
}

fn servers(n: usize, timeout: Duration) -> (Vec<PsServer>, Vec<String>) {
    let servers: Vec<PsServer> = (0..n)
        .map(|_| {
            PsServer::start(
                "127.0.0.1:0",
                ParamServer::new(config()).unwrap(),
                WORKERS,
                timeout,
                secret(),
            )
            .unwrap()
        })
        .collect();
    let addrs = servers.iter().map(|s| s.local_addr().to_string()).collect();
    (servers, addrs)
}

/// Worker w's keys at step t (repeats and overlaps between workers included) and their
/// gradients.
fn step_data(w: usize, t: usize) -> (Vec<u64>, Vec<f32>) {
    let keys: Vec<u64> = (0..7)
        .map(|i| ((i * 3 + w * 5 + t * 7) % 11) as u64)
        .collect();
    let grads = (0..keys.len() * DIM)
        .map(|i| ((i * 13 + w * 7 + t * 3) % 17) as f32 / 8.0 - 1.0)
        .collect();
    (keys, grads)
}

#[test]
// A step indexes both the data generator and each worker's pulls.
#[allow(clippy::needless_range_loop)]
fn synchronous_steps_on_remote_shards_equal_one_in_process_table() {
    let local = ParamServer::new(config()).unwrap();
    let (servers, addrs) = servers(2, Duration::from_secs(20));
    let steps = 5;
    let pulled: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|w| {
                let addrs = &addrs;
                s.spawn(move || {
                    let t = RemoteTable::connect(
                        addrs,
                        w,
                        WORKERS,
                        DIM,
                        Duration::from_secs(20),
                        secret(),
                    )
                    .unwrap();
                    let rows = (0..steps)
                        .map(|step| {
                            let (keys, grads) = step_data(w, step);
                            let rows = t.pull(&keys).unwrap();
                            t.push(&keys, &grads, 1.0 / WORKERS as f32).unwrap();
                            rows
                        })
                        .collect::<Vec<_>>();
                    // The last push returns once its step is applied everywhere.
                    (rows, t.export().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (pulled, exports): (Vec<_>, Vec<_>) = pulled.into_iter().unzip();
    for step in 0..steps {
        let data: Vec<_> = (0..WORKERS).map(|w| step_data(w, step)).collect();
        for (w, (keys, _)) in data.iter().enumerate() {
            assert_eq!(pulled[w][step], local.pull(keys), "worker {w}, step {step}");
        }
        let pushes: Vec<(&[u64], &[f32])> = data.iter().map(|(k, g)| (&k[..], &g[..])).collect();
        local.push_merged(&pushes, 1.0 / WORKERS as f32).unwrap();
    }
    for remote in exports {
        assert_eq!(remote, local.export());
    }
    // Rows spread over both servers.
    assert!(
        servers
            .iter()
            .all(|s| s.table().stats()[0].rows + s.table().stats()[1].rows > 0)
    );
}

#[test]
fn a_worker_that_never_pushes_fails_the_step_for_the_others_naming_it() {
    let (_servers, addrs) = servers(1, Duration::from_millis(300));
    let results: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS - 1)
            .map(|w| {
                let addrs = &addrs;
                s.spawn(move || {
                    let t = RemoteTable::connect(
                        addrs,
                        w,
                        WORKERS,
                        DIM,
                        Duration::from_secs(5),
                        secret(),
                    )
                    .unwrap();
                    let (keys, grads) = step_data(w, 0);
                    t.push(&keys, &grads, 1.0).unwrap_err().to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in results {
        assert!(e.contains("workers [2] did not push step 1"), "{e}");
        assert!(e.contains(&addrs[0]), "{e}");
    }
}

#[test]
fn mismatched_workers_and_lost_servers_are_errors_naming_the_server() {
    let (servers, addrs) = servers(1, Duration::from_secs(5));
    let connect = |w, workers, dim| {
        RemoteTable::connect(&addrs, w, workers, dim, Duration::from_secs(2), secret())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        connect(0, WORKERS, DIM + 1).contains("rows have 3 elements"),
        "dim"
    );
    assert!(
        connect(0, WORKERS + 1, DIM).contains("serves 3 workers"),
        "workers"
    );
    assert!(
        connect(WORKERS, WORKERS, DIM).contains("worker 3 of 3"),
        "range"
    );
    let first =
        RemoteTable::connect(&addrs, 1, WORKERS, DIM, Duration::from_secs(2), secret()).unwrap();
    assert!(connect(1, WORKERS, DIM).contains("worker 1 is already connected"));
    drop((first, servers));
    // A server that is not there.
    let e = RemoteTable::connect(
        &["127.0.0.1:1".to_string()],
        0,
        WORKERS,
        DIM,
        Duration::from_millis(100),
        secret(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("parameter server 127.0.0.1:1: cannot connect"),
        "{e}"
    );
}

#[test]
fn strangers_are_refused_and_create_no_rows() {
    let (servers, addrs) = servers(1, Duration::from_secs(5));
    // Another job's worker, and one without a secret, are refused before any request.
    for stranger in [JobSecret::generate().unwrap(), JobSecret::insecure_open()] {
        let e = RemoteTable::connect(&addrs, 0, WORKERS, DIM, Duration::from_secs(2), &stranger)
            .err()
            .expect("a stranger is let in")
            .to_string();
        assert!(e.contains("did not let this worker in"), "{e}");
    }
    // A raw client that sends a pull of 2M keys without a handshake gets nothing.
    let mut raw = std::net::TcpStream::connect(&addrs[0]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut frame = vec![0u8; 64];
    frame[..8].copy_from_slice(&(2_000_000u64 * 8).to_le_bytes());
    use std::io::{Read, Write};
    let _ = raw.write_all(&frame);
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer);
    assert!(answer.is_empty(), "a stranger was answered: {answer:?}");
    assert_eq!(
        servers[0]
            .table()
            .stats()
            .iter()
            .map(|s| s.rows)
            .sum::<usize>(),
        0
    );
    // The job's own workers still get in.
    let members: Vec<RemoteTable> = (0..WORKERS)
        .map(|w| {
            RemoteTable::connect(&addrs, w, WORKERS, DIM, Duration::from_secs(2), secret()).unwrap()
        })
        .collect();
    assert_eq!(members.len(), WORKERS);
}

/// Connections past the workers' own and 64 spare ones (a flood of strangers that never
/// finish a handshake) are turned away with a reason, costing no thread; once they are
/// gone, the job's workers get in.
#[test]
fn a_flood_of_connections_is_turned_away_and_the_workers_get_in_after() {
    let (_servers, addrs) = servers(1, Duration::from_secs(5));
    let flood: Vec<std::net::TcpStream> = (0..WORKERS + 64)
        .map(|_| std::net::TcpStream::connect(&addrs[0]).unwrap())
        .collect();
    let start = std::time::Instant::now();
    let refused = loop {
        // The server takes the flood in its own time: until it has, a worker gets in.
        match RemoteTable::connect(&addrs, 0, WORKERS, DIM, Duration::from_secs(2), secret()) {
            Err(e) => break e.to_string(),
            Ok(t) => drop(t),
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never refused");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        refused.contains("turned this process away: it serves 67 connections already"),
        "{refused}"
    );
    drop(flood);
    let start = std::time::Instant::now();
    let members = loop {
        let tries: Result<Vec<RemoteTable>, _> = (0..WORKERS)
            .map(|w| {
                RemoteTable::connect(&addrs, w, WORKERS, DIM, Duration::from_secs(2), secret())
            })
            .collect();
        match tries {
            Ok(members) => break members,
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50));
                let _ = e;
            }
            Err(e) => panic!("the workers are kept out after the flood: {e}"),
        }
    };
    assert_eq!(members.len(), WORKERS);
}
