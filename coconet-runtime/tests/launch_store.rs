//! The rendezvous store over loopback: values, waits, barriers, and every failure ending in
//! a clear error within its timeout.

use coconet_runtime::launch::{BARRIER_PREFIX, Store, StoreError, StoreServer};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Barrier as StdBarrier};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn server() -> StoreServer {
    StoreServer::bind("127.0.0.1:0").expect("bind the store")
}

fn client(s: &StoreServer) -> Store {
    Store::connect(s.local_addr(), T).expect("connect")
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
        let mut c = Store::connect(addr, T).unwrap();
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
                let mut c = Store::connect(addr, T).unwrap();
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

/// Connections that never greet are closed after the handshake deadline.
#[test]
fn a_connection_that_never_greets_does_not_hold_the_server() {
    let s = server();
    let mut idle = std::net::TcpStream::connect(s.local_addr()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = Vec::new();
    let start = Instant::now();
    // The server answers with an error and closes the connection (EOF).
    idle.read_to_end(&mut buf).unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(String::from_utf8_lossy(&buf).contains("no greeting within"));
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
    let Err(e) = Store::connect(s.local_addr(), Duration::from_secs(2)) else {
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
                let mut c = Store::connect(addr, T).unwrap();
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
                let mut c = Store::connect(addr, T).unwrap();
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
                let mut c = Store::connect(addr, T).unwrap();
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
                let mut c = Store::connect(addr, T).unwrap();
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
    let err = Store::connect(format!("127.0.0.1:{port}"), Duration::from_millis(400)).unwrap_err();
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
        StoreServer::bind(format!("127.0.0.1:{port}")).unwrap()
    });
    let mut c = Store::connect(format!("127.0.0.1:{port}"), T).unwrap();
    let s = starter.join().unwrap();
    c.set("up", b"yes").unwrap();
    assert_eq!(client(&s).get("up", T).unwrap(), b"yes".to_vec());
}

#[test]
fn binding_a_port_in_use_is_a_clear_error() {
    let s = server();
    let err = StoreServer::bind(s.local_addr()).unwrap_err();
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
    let err = Store::connect(addr, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, StoreError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    fake.join().unwrap();
}

#[test]
fn a_client_that_is_not_a_store_client_is_refused() {
    let s = server();
    let mut raw = std::net::TcpStream::connect(s.local_addr()).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    // A well-framed payload that is not a Hello.
    raw.write_all(&[1, 0, 0, 0, 5]).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert_eq!(answer[4], 5, "an Error answer: {answer:?}");
    assert!(String::from_utf8_lossy(&answer).contains("not a coconet store client"));
    // The server still serves real clients.
    client(&s).set("ok", b"").unwrap();
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
