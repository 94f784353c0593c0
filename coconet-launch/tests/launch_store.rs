//! The rendezvous store over loopback: values, waits, barriers, and every failure ending in
//! a clear error within its timeout.

use coconet_launch::{BARRIER_PREFIX, JobSecret, Store, StoreError, StoreServer};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Barrier as StdBarrier};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// The job secret of every store in this file.
fn secret() -> &'static JobSecret {
    static SECRET: std::sync::OnceLock<JobSecret> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| JobSecret::generate().expect("a secret"))
}

fn server() -> StoreServer {
    StoreServer::bind("127.0.0.1:0", secret().clone()).expect("bind the store")
}

fn client(s: &StoreServer) -> Store {
    Store::connect(s.local_addr(), secret(), T).expect("connect")
}

#[test]
fn set_then_get_and_try_get() {
    let s = server();
    assert_ne!(s.local_addr().port(), 0);
    let mut a = client(&s);
    let mut b = client(&s);
    assert_eq!(b.try_get("k").unwrap(), None);
    a.set("k", b"hello").unwrap();
    assert_eq!(b.get("k", T).unwrap(), b"hello".to_vec());
    assert_eq!(b.try_get("k").unwrap(), Some(b"hello".to_vec()));
    // Replacing a value, and an empty value.
    a.set("k", b"").unwrap();
    assert_eq!(b.get("k", T).unwrap(), Vec::<u8>::new());
    // A large value (1 MiB) arrives intact.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    a.set("big", &big).unwrap();
    assert_eq!(b.get("big", T).unwrap(), big);
}

#[test]
fn get_waits_for_a_later_set() {
    let s = server();
    let addr = s.local_addr();
    let setter = thread::spawn(move || {
        let mut c = Store::connect(addr, secret(), T).unwrap();
        thread::sleep(Duration::from_millis(300));
        c.set("late", &[4, 2]).unwrap();
    });
    let mut c = client(&s);
    let start = Instant::now();
    assert_eq!(c.get("late", T).unwrap(), vec![4, 2]);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "returned after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "returned after {waited:?}");
    setter.join().unwrap();
}

#[test]
fn get_and_wait_time_out_naming_the_key() {
    let s = server();
    let mut c = client(&s);
    let start = Instant::now();
    let err = c.get("never", Duration::from_millis(300)).unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
    match &err {
        StoreError::Timeout { op, key, waited } => {
            assert_eq!((*op, key.as_str()), ("get", "never"));
            assert_eq!(*waited, Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(err.to_string().contains("\"never\""), "{err}");
    // The connection is still usable after a timeout.
    c.set("a", b"1").unwrap();
    c.set("c", b"1").unwrap();
    let err = c
        .wait(&["a", "b", "c"], Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Timeout { op: "wait", key, .. } if key == "b"),
        "{err:?}"
    );
    c.set("b", b"1").unwrap();
    c.wait(&["a", "b", "c"], T).unwrap();
}

#[test]
fn barrier_with_eight_threads_three_times() {
    let s = server();
    let addr = s.local_addr();
    let n = 8;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            thread::spawn(move || {
                let mut c = Store::connect(addr, secret(), T).unwrap();
                for round in 0..3i64 {
                    // Stagger arrivals so some ranks really wait.
                    thread::sleep(Duration::from_millis(10 * rank as u64));
                    c.add(&format!("arrived/{round}"), 1).unwrap();
                    c.barrier("step", n, T).unwrap();
                    // Everyone has arrived: every rank sees the full count.
                    assert_eq!(c.add(&format!("arrived/{round}"), 0).unwrap(), n as i64);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Rounds 0 and 1 were cleaned up; only the last round's keys remain.
    let mut c = client(&s);
    let key = |round: usize, what: &str| format!("{BARRIER_PREFIX}step/{round}/{what}");
    for round in 0..2 {
        assert_eq!(
            c.try_get(&key(round, "done")).unwrap(),
            None,
            "round {round}"
        );
        assert_eq!(
            c.try_get(&key(round, "arrived")).unwrap(),
            None,
            "round {round}"
        );
    }
    assert_eq!(c.try_get(&key(2, "done")).unwrap(), Some(Vec::new()));
}

#[test]
fn delete_removes_a_key_and_says_whether_it_existed() {
    let s = server();
    let mut c = client(&s);
    c.set("k", b"v").unwrap();
    assert!(c.delete("k").unwrap());
    assert!(!c.delete("k").unwrap());
    assert_eq!(c.try_get("k").unwrap(), None);
}

/// Connections that never prove the secret are closed after the handshake deadline.
#[test]
fn a_connection_that_never_greets_does_not_hold_the_server() {
    let s = server();
    let mut idle = std::net::TcpStream::connect(s.local_addr()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = Vec::new();
    let start = Instant::now();
    // The server closes the connection (EOF) without a byte: a stranger learns nothing.
    idle.read_to_end(&mut buf).unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(buf.is_empty(), "{buf:?}");
    // Real clients still get in.
    let mut c = client(&s);
    c.set("after", b"1").unwrap();
}

/// At its budget (4,096 connections) the store refuses a newcomer with a reason, and takes
/// clients again once connections close.
#[test]
fn a_store_at_its_connection_budget_refuses_newcomers_with_a_reason() {
    let s = server();
    // 4,096 connections on each side, plus this binary's other tests.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    assert!(
        limit.rlim_cur >= 8_500,
        "this test needs 8,500 descriptors (the store server raised the soft limit to the \
         hard limit, {}): raise `ulimit -Hn`",
        limit.rlim_max
    );
    // Clients that greeted and stay idle (no deadline applies to them).
    let idle: Vec<Store> = (0..4096).map(|_| client(&s)).collect();
    let Err(e) = Store::connect(s.local_addr(), secret(), Duration::from_secs(2)) else {
        panic!("a connection past the budget is accepted");
    };
    let e = e.to_string();
    assert!(e.contains("4096 connections already"), "{e}");
    drop(idle);
    thread::sleep(Duration::from_millis(500));
    let mut c = client(&s);
    c.set("after", b"1").unwrap();
}

#[test]
fn barrier_missing_a_rank_times_out_naming_it() {
    let s = server();
    let addr = s.local_addr();
    let start = Instant::now();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            thread::spawn(move || {
                let mut c = Store::connect(addr, secret(), T).unwrap();
                c.barrier("init", 4, Duration::from_millis(500))
            })
        })
        .collect();
    for h in handles {
        let err = h.join().unwrap().unwrap_err();
        match &err {
            StoreError::BarrierTimeout {
                name,
                arrived,
                world_size,
                waited,
            } => {
                assert_eq!((name.as_str(), *arrived, *world_size), ("init", 3, 4));
                assert_eq!(*waited, Duration::from_millis(500));
            }
            other => panic!("expected a barrier timeout, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("barrier \"init\""), "{text}");
        assert!(text.contains("3 of 4 ranks arrived"), "{text}");
    }
    assert!(start.elapsed() < Duration::from_secs(4));
}

#[test]
fn a_barrier_with_too_many_ranks_is_an_error() {
    let s = server();
    let mut a = client(&s);
    let mut b = client(&s);
    a.barrier("pair", 1, T).unwrap();
    // The second entrant of round 0 of a size-1 barrier.
    let err = b.barrier("pair", 1, T).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::BarrierOverflow {
                arrived: 2,
                world_size: 1,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn counters_are_atomic() {
    let s = server();
    let addr = s.local_addr();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            thread::spawn(move || {
                let mut c = Store::connect(addr, secret(), T).unwrap();
                for _ in 0..100 {
                    c.add("n", 1).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut c = client(&s);
    assert_eq!(c.add("n", -400).unwrap(), 0);
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.get("n", T).unwrap(), b"5".to_vec());
    c.set("text", b"abc").unwrap();
    let err = c.add("text", 1).unwrap_err();
    assert!(
        matches!(&err, StoreError::Rejected { op: "add", key, .. } if key == "text"),
        "{err:?}"
    );
    // Still usable after a refused request.
    assert_eq!(c.add("n", 1).unwrap(), 6);
}

#[test]
fn one_rank_shares_an_id_with_all() {
    // How the CUDA backend shares the NCCL unique id: rank 0 publishes, the others read.
    let s = server();
    let addr = s.local_addr();
    let id: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(37)).collect();
    let start = Arc::new(StdBarrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            let (id, start) = (id.clone(), Arc::clone(&start));
            thread::spawn(move || {
                let mut c = Store::connect(addr, secret(), T).unwrap();
                start.wait();
                if rank == 0 {
                    thread::sleep(Duration::from_millis(50));
                    c.set("nccl/unique_id", &id).unwrap();
                }
                c.get("nccl/unique_id", T).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), id);
    }
}

#[test]
fn every_rank_gathers_every_value_in_rank_order() {
    // How ranks share CUDA IPC handles and agree on capabilities; a key reused three
    // times meets round by round, and leaves nothing behind in the store.
    let s = server();
    let addr = s.local_addr();
    let handles: Vec<_> = (0..4u8)
        .map(|rank| {
            thread::spawn(move || {
                let mut c = Store::connect(addr, secret(), T).unwrap();
                (0..3u8)
                    .map(|round| {
                        thread::sleep(Duration::from_millis(10 * u64::from(rank)));
                        let value = vec![rank + 10 * round; rank as usize];
                        c.all_gather("ipc/0", rank as usize, 4, &value, T).unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let want: Vec<Vec<Vec<u8>>> = (0..3u8)
        .map(|round| (0..4u8).map(|r| vec![r + 10 * round; r as usize]).collect())
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
    let mut c = client(&s);
    for round in 0..3 {
        for what in ["0", "1", "2", "3", "read"] {
            let key = format!("ipc/0/{round}/{what}");
            assert_eq!(c.try_get(&key).unwrap(), None, "{key} left in the store");
        }
    }
}

#[test]
fn a_rank_missing_from_a_gather_is_named() {
    let s = server();
    let mut c = client(&s);
    let e = c
        .all_gather("caps", 0, 3, b"y", Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    assert!(e.contains("caps/0/1"), "{e}");
}

#[test]
fn connecting_to_a_closed_port_is_a_clear_error() {
    // A port that was free a moment ago.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = Store::connect(
        format!("127.0.0.1:{port}"),
        secret(),
        Duration::from_millis(400),
    )
    .unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{took:?}"
    );
    match &err {
        StoreError::Connect { addr, source, .. } => {
            assert_eq!(addr, &format!("127.0.0.1:{port}"));
            assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("MASTER_ADDR"), "{text}");
}

#[test]
fn connect_retries_until_the_server_starts() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let starter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        StoreServer::bind(format!("127.0.0.1:{port}"), secret().clone()).unwrap()
    });
    let mut c = Store::connect(format!("127.0.0.1:{port}"), secret(), T).unwrap();
    let s = starter.join().unwrap();
    c.set("up", b"yes").unwrap();
    assert_eq!(client(&s).get("up", T).unwrap(), b"yes".to_vec());
}

#[test]
fn binding_a_port_in_use_is_a_clear_error() {
    let s = server();
    let err = StoreServer::bind(s.local_addr(), secret().clone()).unwrap_err();
    assert!(matches!(err, StoreError::Bind { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&s.local_addr().to_string()),
        "{err}"
    );
}

#[test]
fn a_server_going_away_ends_a_wait_with_an_error() {
    let s = server();
    let mut c = client(&s);
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        s.shutdown();
    });
    let start = Instant::now();
    let err = c.get("never", Duration::from_secs(30)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, StoreError::Io { op: "get", .. }), "{err:?}");
    assert!(err.to_string().contains("closed the connection"), "{err}");
    // The connection is marked broken rather than reused.
    assert!(matches!(c.set("x", b""), Err(StoreError::Broken { .. })));
    stopper.join().unwrap();
}

#[test]
fn a_peer_that_is_not_a_store_is_a_protocol_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut hello = [0u8; 64];
        let _ = conn.read(&mut hello);
        conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let err = Store::connect(addr, secret(), Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, StoreError::Auth { .. }), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains(&addr.to_string()) && err.contains("not a coconet process"),
        "{err}"
    );
    fake.join().unwrap();
}

#[test]
fn a_client_that_is_not_a_store_client_gets_nothing() {
    let s = server();
    let mut raw = std::net::TcpStream::connect(s.local_addr()).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    // The old protocol's Hello (magic and version in a frame), padded to a handshake's
    // length: not coconet's handshake, so the connection closes without a byte.
    let mut hello = vec![
        13, 0, 0, 0, 0, b'C', b'C', b'N', b'S', 1, 0, 0, 0, 0, 0, 0, 0,
    ];
    hello.resize(42, 0);
    raw.write_all(&hello).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert!(answer.is_empty(), "{answer:?}");
    // The server still serves real clients.
    client(&s).set("ok", b"").unwrap();
}

#[test]
fn strangers_without_the_job_secret_are_refused_and_the_job_goes_on() {
    let s = server();
    let mut member = client(&s);
    member.set("coconet/tcp/g/0", b"10.0.0.1:4000").unwrap();
    // Another job's secret: refused, told why, nothing read or written.
    let other = JobSecret::generate().unwrap();
    let start = Instant::now();
    let err = Store::connect(s.local_addr(), &other, T).unwrap_err();
    assert!(matches!(err, StoreError::Auth { .. }), "{err:?}");
    assert!(
        err.to_string().contains("does not hold this job's secret"),
        "{err}"
    );
    // No secret at all (the opt-out) against a store that has one.
    let err = Store::connect(s.local_addr(), &JobSecret::insecure_open(), T).unwrap_err();
    assert!(err.to_string().contains("requires a job secret"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // A stranger that connects and says nothing is not waited for by the members.
    let _silent = std::net::TcpStream::connect(s.local_addr()).unwrap();
    member.set("coconet/tcp/g/1", b"10.0.0.2:4000").unwrap();
    assert_eq!(
        member.get("coconet/tcp/g/0", T).unwrap(),
        b"10.0.0.1:4000".to_vec(),
        "the stranger changed nothing"
    );
    // And a store without a secret lets only clients without one in.
    let open = StoreServer::bind("127.0.0.1:0", JobSecret::insecure_open()).unwrap();
    Store::connect(open.local_addr(), &JobSecret::insecure_open(), T).unwrap();
    let err = Store::connect(open.local_addr(), secret(), T).unwrap_err();
    assert!(
        err.to_string().contains("runs without a job secret"),
        "{err}"
    );
}

#[test]
fn an_error_about_a_huge_key_shows_its_start_and_length_not_the_key() {
    let s = server();
    let mut a = client(&s);
    let key = "k".repeat(1 << 20);
    let e = a
        .get(&key, Duration::from_millis(50))
        .unwrap_err()
        .to_string();
    assert!(
        e.len() < 400,
        "{} characters: {}",
        e.len(),
        &e[..400.min(e.len())]
    );
    assert!(
        e.contains("… (1048576 bytes)") && e.contains("timed out"),
        "{e}"
    );
    // A short key is shown whole.
    let e = a
        .get("short", Duration::from_millis(10))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"short\""), "{e}");
}

/// A store holds at most its quota of keys and values: a set past it is refused naming
/// the quota, and deleting makes room again.
#[test]
fn a_store_past_its_quota_refuses_sets() {
    let s = StoreServer::bind_with_quota("127.0.0.1:0", secret().clone(), 1000).unwrap();
    let mut c = client(&s);
    c.set("a", &[0; 600]).unwrap();
    let e = c.set("b", &[0; 600]).unwrap_err().to_string();
    assert!(e.contains("1000-byte quota") && e.contains("\"b\""), "{e}");
    // Replacing a value counts its new size only.
    c.set("a", &[1; 900]).unwrap();
    assert!(c.delete("a").unwrap());
    c.set("b", &[0; 600]).unwrap();
    assert_eq!(c.add("n", 5).unwrap(), 5);
}

/// One address may hold only 64 connections that have not proven the secret: strangers
/// on one host cannot fill the store, and a client turned away retries until its
/// timeout, getting in once they are gone.
#[test]
fn strangers_on_one_address_hold_at_most_64_unproven_connections() {
    let s = server();
    let flood: Vec<std::net::TcpStream> = (0..64)
        .map(|_| std::net::TcpStream::connect(s.local_addr()).unwrap())
        .collect();
    let e = Store::connect(s.local_addr(), secret(), Duration::from_millis(500))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("64 connections that have not proven the job secret"),
        "{e}"
    );
    let released = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        drop(flood);
    });
    // Turned away at first, then let in once the flood closes: one call.
    let mut c = Store::connect(s.local_addr(), secret(), T).unwrap();
    c.set("in", b"1").unwrap();
    released.join().unwrap();
}
