//! The device-free parts: launcher variables, bucket and shard plans, and the rendezvous
//! protocol over real localhost sockets (threads standing in for ranks).

// Lists of one range are the data here (a bucket with one range), not a mistaken range-to-vec.
#![allow(clippy::single_range_in_vec_init)]

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::*;

fn vars(pairs: &[(&str, &str)]) -> impl FnMut(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

const FULL: [(&str, &str); 5] = [
    ("RANK", "3"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("MASTER_ADDR", "node0"),
    ("MASTER_PORT", "29500"),
];

fn with(changes: &[(&'static str, Option<&'static str>)]) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = FULL.to_vec();
    for (k, val) in changes {
        v.retain(|(name, _)| name != k);
        if let Some(val) = val {
            v.push((k, val));
        }
    }
    v
}

fn parse(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, EnvError> {
    LaunchEnv::from_lookup(vars(pairs))
}

#[test]
fn no_launcher_variables_is_a_single_process() {
    assert_eq!(parse(&[]), Ok(None));
    assert_eq!(parse(&[("UNRELATED", "1")]), Ok(None));
}

#[test]
fn all_variables_parse_into_a_launch_env() {
    let env = parse(&with(&[("LOCAL_WORLD_SIZE", Some(" 4 "))]))
        .unwrap()
        .unwrap();
    assert_eq!(
        env,
        LaunchEnv {
            rank: 3,
            world_size: 8,
            local_rank: 1,
            local_world_size: Some(4),
            master_addr: "node0".into(),
            master_port: 29500,
            launcher: Launcher::Torchrun,
        }
    );
    assert_eq!(env.device_ordinal(), 1);
    assert!(!env.is_primary());
    assert_eq!(env.master(), "node0:29500");
    let v6 = parse(&with(&[("MASTER_ADDR", Some("::1"))]))
        .unwrap()
        .unwrap();
    assert_eq!(v6.master(), "[::1]:29500");
}

#[test]
fn partly_set_variables_name_the_missing_ones() {
    let e = parse(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
    assert_eq!(
        e,
        EnvError::Partial {
            set: vec!["RANK", "WORLD_SIZE"],
            missing: vec!["LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"],
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("LOCAL_RANK") && text.contains("none of them"),
        "{text}"
    );
    let e = parse(&[("LOCAL_WORLD_SIZE", "2")]).unwrap_err();
    assert!(matches!(e, EnvError::Partial { .. }), "{e}");
}

#[test]
fn bad_values_are_typed_errors_naming_the_variable_and_value() {
    let cases: Vec<(Vec<(&str, &str)>, EnvError)> = vec![
        (
            with(&[("RANK", Some("one"))]),
            EnvError::NotANumber {
                var: "RANK",
                value: "one".into(),
            },
        ),
        (
            with(&[("WORLD_SIZE", Some("-2"))]),
            EnvError::NotANumber {
                var: "WORLD_SIZE",
                value: "-2".into(),
            },
        ),
        (
            with(&[("LOCAL_RANK", Some(""))]),
            EnvError::NotANumber {
                var: "LOCAL_RANK",
                value: "".into(),
            },
        ),
        (
            with(&[("WORLD_SIZE", Some("0"))]),
            EnvError::ZeroSize { var: "WORLD_SIZE" },
        ),
        (
            with(&[("RANK", Some("8"))]),
            EnvError::RankOutOfRange {
                var: "RANK",
                value: 8,
                size_var: "WORLD_SIZE",
                size: 8,
            },
        ),
        (
            with(&[("LOCAL_RANK", Some("4")), ("LOCAL_WORLD_SIZE", Some("4"))]),
            EnvError::RankOutOfRange {
                var: "LOCAL_RANK",
                value: 4,
                size_var: "LOCAL_WORLD_SIZE",
                size: 4,
            },
        ),
        (
            with(&[("LOCAL_RANK", Some("9"))]),
            EnvError::RankOutOfRange {
                var: "LOCAL_RANK",
                value: 9,
                size_var: "WORLD_SIZE",
                size: 8,
            },
        ),
        (
            with(&[("LOCAL_WORLD_SIZE", Some("0"))]),
            EnvError::ZeroSize {
                var: "LOCAL_WORLD_SIZE",
            },
        ),
        (
            with(&[("LOCAL_WORLD_SIZE", Some("9"))]),
            EnvError::LocalLargerThanWorld { local: 9, world: 8 },
        ),
        (
            with(&[("MASTER_PORT", Some("0"))]),
            EnvError::BadPort {
                var: "MASTER_PORT",
                value: "0".into(),
            },
        ),
        (
            with(&[("MASTER_PORT", Some("70000"))]),
            EnvError::BadPort {
                var: "MASTER_PORT",
                value: "70000".into(),
            },
        ),
        (
            with(&[("MASTER_PORT", Some("http"))]),
            EnvError::BadPort {
                var: "MASTER_PORT",
                value: "http".into(),
            },
        ),
        (with(&[("MASTER_ADDR", Some("  "))]), EnvError::EmptyAddr),
    ];
    for (pairs, want) in cases {
        let got = parse(&pairs).unwrap_err();
        assert_eq!(got, want, "{pairs:?}");
        let text = got.to_string();
        assert!(!text.is_empty());
    }
    let text = parse(&with(&[("RANK", Some("8"))]))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("RANK=8") && text.contains("WORLD_SIZE=8"),
        "{text}"
    );
    let text = parse(&with(&[("MASTER_PORT", Some("0"))]))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("MASTER_PORT=\"0\"") && text.contains("29500"),
        "{text}"
    );
}

#[test]
fn the_rendezvous_port_follows_the_override_and_torchruns_agent_store() {
    let env = parse(&FULL).unwrap().unwrap();
    assert_eq!(rendezvous_port(&env, vars(&[])), Ok(29500));
    assert_eq!(
        rendezvous_port(&env, vars(&[("TORCHELASTIC_USE_AGENT_STORE", "True")])),
        Ok(29501)
    );
    assert_eq!(
        rendezvous_port(&env, vars(&[("TORCHELASTIC_USE_AGENT_STORE", "False")])),
        Ok(29500)
    );
    assert_eq!(
        rendezvous_port(
            &env,
            vars(&[("TORCHELASTIC_USE_AGENT_STORE", "True"), (PORT_VAR, "4000")])
        ),
        Ok(4000)
    );
    assert!(matches!(
        rendezvous_port(&env, vars(&[(PORT_VAR, "0")])),
        Err(EnvError::BadPort { .. })
    ));
    let top = LaunchEnv {
        master_port: u16::MAX,
        ..env
    };
    assert!(matches!(
        rendezvous_port(&top, vars(&[("TORCHELASTIC_USE_AGENT_STORE", "1")])),
        Err(EnvError::BadPort { .. })
    ));
}

#[test]
fn buckets_fill_up_to_the_cap_in_readiness_order() {
    // Backward order: the last tensor of the buffer first. 4-byte elements, cap 40 bytes = 10.
    let tensors = [20..30, 14..20, 10..14, 0..10];
    let plan = BucketPlan::new(&tensors, 30, 4, 40).unwrap();
    let got: Vec<(Vec<usize>, Vec<std::ops::Range<usize>>, usize)> = plan
        .buckets()
        .iter()
        .map(|b| (b.tensors.clone(), b.ranges.clone(), b.elements))
        .collect();
    assert_eq!(
        got,
        vec![
            (vec![0], vec![20..30], 10),
            (vec![1, 2], vec![10..20], 10), // adjacent ranges merge into one collective
            (vec![3], vec![0..10], 10),
        ]
    );
    assert_eq!(plan.bucket_of(2), Some(1));
    assert_eq!(plan.bucket_of(4), None);
    // A tensor larger than the cap gets its own bucket; non-adjacent ranges stay apart.
    let plan = BucketPlan::new(&[0..3, 10..40, 5..7, 8..9], 40, 4, 24).unwrap();
    let ranges: Vec<_> = plan.buckets().iter().map(|b| b.ranges.clone()).collect();
    assert_eq!(ranges, vec![vec![0..3], vec![10..40], vec![5..7, 8..9]]);
    // One bucket when everything fits (the default 25 MiB).
    let plan = BucketPlan::new(&tensors, 30, 4, DEFAULT_BUCKET_BYTES).unwrap();
    assert_eq!(plan.buckets().len(), 1);
    assert_eq!(plan.buckets()[0].ranges, vec![0..30]);
}

#[test]
fn bad_tensor_ranges_are_refused() {
    let err = |t: &[std::ops::Range<usize>], len, cap| {
        BucketPlan::new(t, len, 4, cap).unwrap_err().to_string()
    };
    assert!(err(&[], 10, 40).contains("no tensors"));
    assert!(err(&[0..0], 10, 40).contains("empty range"));
    assert!(err(&[0..11], 10, 40).contains("holds 10 elements"));
    let text = err(&[0..5, 8..10, 4..6], 10, 40);
    assert!(
        text.contains("overlap") && text.contains("0..5") && text.contains("4..6"),
        "{text}"
    );
    assert!(err(&[0..5], 10, 0).contains("cap of 0"));
}

#[test]
fn shard_plans_pad_to_equal_shards() {
    for (len, world, shard) in [(10, 4, 3), (12, 4, 3), (1, 3, 1), (0, 2, 0), (7, 1, 7)] {
        let p = ShardPlan::new(len, world).unwrap();
        assert_eq!((p.len(), p.world(), p.shard_len()), (len, world, shard));
        assert_eq!(p.padded_len(), shard * world);
        assert!(p.padded_len() >= len && p.padded_len() < len + world);
        let owned: usize = (0..world).map(|r| p.owned(r).len()).sum();
        assert_eq!(owned, len, "owned ranges cover the buffer once");
        for r in 0..world {
            assert_eq!(p.shard_range(r), r * shard..(r + 1) * shard);
        }
    }
    let p = ShardPlan::new(4, 3).unwrap(); // shards of 2: ranks 0, 1 real, rank 2 all padding
    assert_eq!((p.owned(1), p.owned(2)), (2..4, 4..4));
    assert!(ShardPlan::new(5, 0).is_err());
}

// --- The rendezvous, over localhost sockets ----------------------------------------------

fn test_id(seed: u8) -> UniqueId {
    let bytes: Vec<u8> = (0..128u32)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect();
    UniqueId::from_bytes(&bytes).unwrap()
}

/// The test job's credentials: one secret, no settings.
pub(super) fn creds() -> Credentials {
    Credentials {
        secret: Secret::new(b"a test secret of 32 bytes, fixed", "test").unwrap(),
        settings: Settings::default(),
    }
}

/// A rank's fetch with the test credentials; the id alone.
pub(super) fn fetch(
    host: &str,
    port: u16,
    world: usize,
    rank: usize,
    timeout: Duration,
) -> Result<UniqueId, DdpError> {
    fetch_id(host, port, world, rank, &creds(), timeout).map(|(id, _)| id)
}

fn server() -> (Server, u16) {
    let s = Server::bind("127.0.0.1", 0, None).unwrap();
    let port = s.local_addr().port();
    (s, port)
}

const SHORT: Duration = Duration::from_millis(400);

#[test]
fn every_rank_gets_rank_0s_id() {
    let (s, port) = server();
    let id = test_id(1);
    let clients: Vec<_> = (1..4)
        .map(|r| {
            std::thread::spawn(move || fetch("127.0.0.1", port, 4, r, Duration::from_secs(20)))
        })
        .collect();
    s.serve(4, &id, &creds(), Duration::from_secs(20)).unwrap();
    for c in clients {
        assert_eq!(c.join().unwrap().unwrap(), id);
    }
}

#[test]
fn a_rank_that_starts_before_rank_0_retries_until_it_listens() {
    // Pick a free port, release it, start the client first, then the server.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client =
        std::thread::spawn(move || fetch("localhost", port, 2, 1, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(300));
    let s = Server::bind("127.0.0.1", port, None).unwrap();
    let id = test_id(2);
    s.serve(2, &id, &creds(), Duration::from_secs(20)).unwrap();
    assert_eq!(client.join().unwrap().unwrap(), id);
}

#[test]
fn a_mismatched_world_size_fails_on_both_sides() {
    let (s, port) = server();
    let client =
        std::thread::spawn(move || fetch("127.0.0.1", port, 3, 1, Duration::from_secs(20)));
    let e = s
        .serve(2, &test_id(3), &creds(), Duration::from_secs(20))
        .unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, DdpError::Rendezvous(RendezvousError::Mismatch { .. }))
            && text.contains("WORLD_SIZE=3")
            && text.contains("WORLD_SIZE=2"),
        "{text}"
    );
    let e = client.join().unwrap().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, DdpError::Rendezvous(RendezvousError::Mismatch { .. }))
            && text.contains("rank 1 has WORLD_SIZE=3")
            && text.contains("WORLD_SIZE=2"),
        "{text}"
    );
}

#[test]
fn a_repeated_or_out_of_range_rank_is_refused() {
    let (s, port) = server();
    let a = std::thread::spawn(move || fetch("127.0.0.1", port, 3, 1, Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(200));
    let b = std::thread::spawn(move || fetch("127.0.0.1", port, 3, 1, Duration::from_secs(20)));
    let e = s
        .serve(3, &test_id(4), &creds(), Duration::from_secs(20))
        .unwrap_err();
    assert!(
        e.to_string().contains("two processes say they are rank 1"),
        "{e}"
    );
    let ea = a.join().unwrap().unwrap_err().to_string();
    let eb = b.join().unwrap().unwrap_err().to_string();
    assert!(
        ea.contains("gave up") || eb.contains("gave up"),
        "{ea} / {eb}"
    );
    assert!(
        ea.contains("RANK=1") || eb.contains("RANK=1"),
        "{ea} / {eb}"
    );

    let (s, port) = server();
    let c = std::thread::spawn(move || fetch("127.0.0.1", port, 2, 0, Duration::from_secs(20)));
    let e = s
        .serve(2, &test_id(4), &creds(), Duration::from_secs(20))
        .unwrap_err();
    assert!(e.to_string().contains("says it is rank 0"), "{e}");
    assert!(c
        .join()
        .unwrap()
        .unwrap_err()
        .to_string()
        .contains("refused RANK=0"));
}

#[test]
fn a_missing_rank_times_out_on_every_side_without_hanging() {
    let (s, port) = server();
    let start = Instant::now();
    let client =
        std::thread::spawn(move || fetch("127.0.0.1", port, 3, 1, Duration::from_secs(20)));
    let e = s.serve(3, &test_id(5), &creds(), SHORT).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    match &e {
        DdpError::Rendezvous(RendezvousError::MissingRanks {
            missing, world: 3, ..
        }) => {
            assert_eq!(missing, &vec![2])
        }
        other => panic!("not a missing-rank error: {other}"),
    }
    assert!(e.to_string().contains("rank(s) [2] never connected"), "{e}");
    // The connected rank is told at once rather than waiting for its own (longer) timeout.
    let e = client.join().unwrap().unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(
        e.to_string()
            .contains("rank 0 gave up: 1 rank(s) never connected"),
        "{e}"
    );
}

#[test]
fn no_rank_0_is_a_timeout_naming_the_address() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let e = fetch("127.0.0.1", port, 2, 1, SHORT).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let text = e.to_string();
    assert!(
        matches!(
            e,
            DdpError::Rendezvous(RendezvousError::NoAnswer {
                rank: 1,
                world: 2,
                ..
            })
        ) && text.contains(&format!("127.0.0.1:{port}")),
        "{text}"
    );
}

#[test]
fn stray_connections_are_dropped_and_the_rendezvous_goes_on() {
    use std::io::Write;
    let (s, port) = server();
    let stray = std::thread::spawn(move || {
        // One that says something else, one that closes at once.
        let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = t.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        fetch("127.0.0.1", port, 2, 1, Duration::from_secs(20))
    });
    let id = test_id(6);
    s.serve(2, &id, &creds(), Duration::from_secs(20)).unwrap();
    assert_eq!(stray.join().unwrap().unwrap(), id);
}

#[test]
fn a_service_that_is_not_rank_0_is_named_as_such() {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&[b'x'; 200]).unwrap();
    });
    let e = fetch("127.0.0.1", port, 2, 1, Duration::from_secs(20)).unwrap_err();
    assert!(
        matches!(e, DdpError::Rendezvous(RendezvousError::Stray { .. })),
        "{e}"
    );
    fake.join().unwrap();
}

#[test]
fn a_taken_port_is_a_bind_error_naming_it() {
    let (_s, port) = server();
    let e = Server::bind("127.0.0.1", port, Some(([127, 0, 0, 1], port).into())).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&port.to_string()) && text.contains("MASTER_PORT"),
        "{text}"
    );
}

#[test]
fn silent_stray_connections_do_not_keep_rank_0_past_its_timeout() {
    let (s, port) = server();
    // Three connections that never say anything, all waiting in the accept queue.
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let start = Instant::now();
    let e = s.serve(2, &test_id(7), &creds(), SHORT).unwrap_err();
    let took = start.elapsed();
    drop(silent);
    assert!(
        took < Duration::from_secs(3),
        "rank 0 waited {took:?} with a timeout of {SHORT:?}"
    );
    assert!(e.to_string().contains("never connected"), "{e}");
}
