//! What the job secret costs a connection: a TCP connection on loopback opened and
//! answered with one byte, against the same connection with the handshake first (one
//! more round trip, four HMAC-SHA256s, 64 bytes of nonces from the OS). Nothing of it
//! happens per step: a connection is authenticated once, when a job starts.
//!
//! ```text
//! cargo bench -p coconet-trust --bench handshake
//! ```

#![allow(missing_docs)] // criterion_group! makes undocumented functions.

use coconet_trust::{JobSecret, handshake};
use criterion::{Criterion, criterion_group, criterion_main};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// A server thread that accepts connections forever, authenticating them if `secret`
/// is given, and answers one byte on each.
fn server(secret: Option<JobSecret>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (ready, up) = mpsc::channel();
    std::thread::spawn(move || {
        ready.send(()).unwrap();
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_nodelay(true);
            if let Some(secret) = &secret
                && handshake::server(&mut s, secret, "bench", Duration::from_secs(5)).is_err()
            {
                continue;
            }
            let _ = s.write_all(&[1]);
        }
    });
    up.recv().unwrap();
    addr
}

fn connect(addr: std::net::SocketAddr, secret: Option<&JobSecret>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    if let Some(secret) = secret {
        handshake::client(&mut s, secret, "bench", Duration::from_secs(5)).unwrap();
    }
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
}

fn bench(c: &mut Criterion) {
    let secret = JobSecret::generate().unwrap();
    let plain = server(None);
    let proven = server(Some(secret.clone()));
    let mut g = c.benchmark_group("loopback connection");
    // Interleaved by criterion's order: plain, then proven, per sample set.
    g.bench_function("plain", |b| b.iter(|| connect(plain, None)));
    g.bench_function("with handshake", |b| {
        b.iter(|| connect(proven, Some(&secret)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
