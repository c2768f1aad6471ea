//! Issue 36, section 1: the rendezvous against a hostile network and a careless launcher.
//! Each test here failed before its fix (see the closing note of the issue).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::tests::{creds, fetch};
use super::*;

fn test_id(seed: u8) -> UniqueId {
    let bytes: Vec<u8> = (0..128u32)
        .map(|i| (i as u8).wrapping_mul(5) ^ seed)
        .collect();
    UniqueId::from_bytes(&bytes).unwrap()
}

/// A hello as any process that read the source could send it (its nonce all zeros).
fn forged_hello(world: u32, rank: u32, version: u16) -> Vec<u8> {
    let mut h = b"hipkrdzv".to_vec();
    h.extend(version.to_be_bytes());
    h.extend(world.to_be_bytes());
    h.extend(rank.to_be_bytes());
    h.extend([0u8; 32]);
    h
}

fn server() -> (Server, u16) {
    let s = Server::bind("127.0.0.1", 0, None).unwrap();
    let port = s.local_addr().port();
    (s, port)
}

const TEN: Duration = Duration::from_secs(10);

#[test]
fn a_forged_peer_gets_no_id_and_the_real_rank_joins() {
    let (s, port) = server();
    // A forger that answers the challenge with a made-up proof, then waits for the id.
    let forger = std::thread::spawn(move || {
        let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let _ = t.write_all(&forged_hello(2, 1, VERSION));
        let mut challenge = [0u8; 11 + 64];
        let _ = t.read_exact(&mut challenge);
        let _ = t.write_all(&[0u8; 36]);
        let mut got = Vec::new();
        let _ = t.read_to_end(&mut got);
        got
    });
    // And one holding another secret, through the real client.
    let other = std::thread::spawn(move || {
        let c = Credentials {
            secret: Secret::new(b"another job's secret, 32 bytes..", "test").unwrap(),
            settings: Settings::default(),
        };
        fetch_id("127.0.0.1", port, 2, 1, &c, Duration::from_secs(3)).map(|(id, _)| id)
    });
    std::thread::sleep(Duration::from_millis(300));
    let real = std::thread::spawn(move || fetch("127.0.0.1", port, 2, 1, TEN));
    let id = test_id(1);
    let served = s.serve(2, &id, &creds(), TEN);
    let got = forger.join().unwrap();
    let id_bytes = id.to_bytes();
    assert!(
        !got.windows(id_bytes.len()).any(|w| w == id_bytes),
        "the forger received the unique id"
    );
    served.unwrap();
    assert_eq!(real.join().unwrap().unwrap(), id);
    // The other job's rank learns that this rank 0 does not hold its secret.
    let e = other.join().unwrap().unwrap_err();
    assert!(
        matches!(e, DdpError::Rendezvous(RendezvousError::Unproved { .. })),
        "{e}"
    );
}

#[test]
fn stray_hellos_of_another_world_or_version_are_dropped_not_fatal() {
    let (s, port) = server();
    let strays = std::thread::spawn(move || {
        for h in [forged_hello(3, 1, VERSION), forged_hello(2, 1, 99)] {
            let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let _ = t.write_all(&h);
        }
        std::thread::sleep(Duration::from_millis(200));
        fetch("127.0.0.1", port, 2, 1, TEN)
    });
    let id = test_id(2);
    s.serve(2, &id, &creds(), TEN).unwrap();
    assert_eq!(strays.join().unwrap().unwrap(), id);
}

#[test]
fn idle_connections_do_not_delay_the_real_ranks() {
    let (s, port) = server();
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        fetch("127.0.0.1", port, 2, 1, Duration::from_secs(8))
    });
    let start = Instant::now();
    let id = test_id(3);
    s.serve(2, &id, &creds(), Duration::from_secs(8)).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(real.join().unwrap().unwrap(), id);
    drop(idle);
}

#[test]
fn more_idle_connections_than_handshake_slots_still_let_the_real_rank_in() {
    let (s, port) = server();
    let idle: Vec<TcpStream> = (0..MAX_HANDSHAKES + 8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let real = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        fetch("127.0.0.1", port, 2, 1, Duration::from_secs(20))
    });
    let id = test_id(4);
    s.serve(2, &id, &creds(), Duration::from_secs(20)).unwrap();
    assert_eq!(real.join().unwrap().unwrap(), id);
    drop(idle);
}

#[test]
fn rank_0_listens_on_master_addrs_interface_only() {
    let (s, _) = server();
    assert_eq!(s.local_addr().ip().to_string(), "127.0.0.1");
}

#[test]
fn a_host_name_that_resolves_to_loopback_only_listens_on_every_interface() {
    // `localhost` is a loopback name: kept. A literal: kept.
    for host in ["localhost", "127.0.0.1"] {
        let s = Server::bind(host, 0, None).unwrap();
        assert!(
            s.local_addr().ip().is_loopback(),
            "{host}: {}",
            s.local_addr()
        );
    }
    // This machine's own name, when /etc/hosts maps it to loopback only (Debian's 127.0.1.1).
    let Ok(name) = std::fs::read_to_string("/etc/hostname") else {
        return;
    };
    let name = name.trim();
    let resolved: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(name, 0))
        .map(|a| a.collect())
        .unwrap_or_default();
    if !name.is_empty() && !resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()) {
        let s = Server::bind(name, 0, None).unwrap();
        assert!(
            s.local_addr().ip().is_unspecified(),
            "{name}: {}",
            s.local_addr()
        );
    }
}

#[test]
fn a_settings_disagreement_is_refused_naming_the_setting() {
    let (s, port) = server();
    let theirs = Credentials {
        settings: Settings(vec![
            ("--seq".into(), "16".into()),
            ("--lr".into(), "0.02".into()),
        ]),
        ..creds()
    };
    let rank1 = std::thread::spawn(move || fetch_id("127.0.0.1", port, 2, 1, &theirs, TEN));
    let mine = Credentials {
        settings: Settings(vec![
            ("--seq".into(), "16".into()),
            ("--lr".into(), "0.01".into()),
        ]),
        ..creds()
    };
    let e = s.serve(2, &test_id(5), &mine, TEN).unwrap_err().to_string();
    assert!(
        e.contains("--lr differs: rank 0 has 0.01, rank 1 has 0.02"),
        "{e}"
    );
    let e = rank1.join().unwrap().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            DdpError::Rendezvous(RendezvousError::Settings { rank: 1, .. })
        ) && text.contains("--lr differs"),
        "{text}"
    );
}

fn torchrun(world: &str) -> impl FnMut(&str) -> Option<String> + '_ {
    move |v| {
        Some(match v {
            "RANK" | "LOCAL_RANK" => "0".into(),
            "WORLD_SIZE" => world.into(),
            "MASTER_ADDR" => "127.0.0.1".into(),
            "MASTER_PORT" => "29500".into(),
            _ => return None,
        })
    }
}

#[test]
fn a_huge_world_size_is_a_usage_error_naming_the_range() {
    let e = LaunchEnv::from_lookup(torchrun("4000000000000")).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("WORLD_SIZE=4000000000000") && text.contains("65536"),
        "{text}"
    );
    assert!(LaunchEnv::from_lookup(torchrun("65536")).is_ok());
    assert!(LaunchEnv::from_lookup(torchrun("65537")).is_err());
}

#[test]
fn a_malformed_rdzv_port_names_hipk_rdzv_port() {
    let env = LaunchEnv::from_lookup(torchrun("2")).unwrap().unwrap();
    let e = rendezvous_port(&env, |v| (v == PORT_VAR).then(|| "70000".to_string())).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("HIPK_RDZV_PORT=\"70000\""), "{text}");
    assert!(!text.starts_with("MASTER_PORT"), "{text}");
}

#[test]
fn comm_timeouts_out_of_range_are_errors_naming_the_variable() {
    for bad in [
        "1e30",
        "18446744073709551615",
        "1e19",
        "abc",
        "0",
        "-5",
        "inf",
        "NaN",
        "604801",
    ] {
        let text = crate::comm::parse_timeout(bad).unwrap_err().to_string();
        assert!(
            text.contains(&format!("HIPK_COMM_TIMEOUT_S={bad:?}")) && text.contains("604800"),
            "HIPK_COMM_TIMEOUT_S={bad}: {text}"
        );
    }
    let ok = |t: &str| crate::comm::parse_timeout(t).unwrap();
    assert_eq!(ok("1.5"), Duration::from_millis(1500));
    assert_eq!(ok(" 600 "), Duration::from_secs(600));
    assert_eq!(ok(""), DEFAULT_TIMEOUT);
    assert_eq!(ok("604800"), crate::comm::MAX_TIMEOUT);
}

#[test]
fn a_secret_file_others_can_read_is_refused_and_the_default_is_made_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("hipk-secret-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let home = dir.to_string_lossy().into_owned();
    let lookup = |h: &str| {
        let h = h.to_string();
        move |v: &str| (v == "HOME").then(|| h.clone())
    };
    // Made when missing, mode 0600; a second load reads the same secret.
    let a = Secret::from_lookup(lookup(&home)).unwrap();
    let file = dir.join(".hipk/rdzv-secret");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let b = Secret::from_lookup(lookup(&home)).unwrap();
    assert!(b.verify(b"x", &[b"y"], &a.mac(b"x", &[b"y"])));
    // Readable by others: refused, naming the file and the fix.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Secret::from_lookup(lookup(&home)).unwrap_err().to_string();
    assert!(e.contains("rdzv-secret") && e.contains("chmod 600"), "{e}");
    // Too short in the variable.
    let e = Secret::from_lookup(|v| (v == SECRET_VAR).then(|| "short".to_string()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HIPK_RDZV_SECRET") && e.contains("5 bytes"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn slurm(extra: &[(&'static str, &'static str)]) -> impl FnMut(&str) -> Option<String> {
    let mut map: Vec<(&str, &str)> = vec![
        ("SLURM_PROCID", "9"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "dcu[07-08,11],login5"),
        ("SLURM_JOB_ID", "123456"),
    ];
    for (k, v) in extra {
        map.retain(|(n, _)| n != k);
        if !v.is_empty() {
            map.push((k, v));
        }
    }
    move |v| {
        map.iter()
            .find(|(k, _)| *k == v)
            .map(|(_, val)| val.to_string())
    }
}

#[test]
fn slurms_variables_describe_a_rank_started_by_srun() {
    let env = LaunchEnv::from_lookup(slurm(&[])).unwrap().unwrap();
    assert_eq!(
        (env.rank, env.world_size, env.local_rank),
        (9, 16, 1),
        "{env:?}"
    );
    assert_eq!(env.master_addr, "dcu07");
    assert_eq!(env.master_port, 20000 + (123456 % 20000) as u16);
    assert_eq!(env.launcher, Launcher::Slurm);
    assert_eq!(env.note(), None);
    // MASTER_ADDR / MASTER_PORT win when set; the older SLURM_NODELIST / SLURM_JOBID work.
    let env = LaunchEnv::from_lookup(slurm(&[("MASTER_ADDR", "head"), ("MASTER_PORT", "4242")]))
        .unwrap()
        .unwrap();
    assert_eq!((env.master_addr.as_str(), env.master_port), ("head", 4242));
    let env = LaunchEnv::from_lookup(slurm(&[
        ("SLURM_JOB_NODELIST", ""),
        ("SLURM_NODELIST", "n[3-4]"),
        ("SLURM_JOB_ID", ""),
        ("SLURM_JOBID", "7"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((env.master_addr.as_str(), env.master_port), ("n3", 20007));
    // torchrun's variables with Slurm's: torchrun's, with a note.
    let mut both = slurm(&[]);
    let mut t = torchrun("2");
    let env = LaunchEnv::from_lookup(|v| t(v).or_else(|| both(v)))
        .unwrap()
        .unwrap();
    assert_eq!((env.rank, env.world_size), (0, 2));
    assert_eq!(env.launcher, Launcher::TorchrunOverSlurm);
    assert!(env.note().unwrap().contains("using torchrun's"));
}

#[test]
fn malformed_slurm_variables_are_errors_naming_the_variable() {
    for (change, needle) in [
        (("SLURM_PROCID", "x"), "SLURM_PROCID=\"x\""),
        (("SLURM_NTASKS", "0"), "SLURM_NTASKS=0"),
        (("SLURM_NTASKS", "99999999"), "SLURM_NTASKS=99999999"),
        (
            ("SLURM_NTASKS", ""),
            "SLURM_NTASKS, which gives the world size",
        ),
        (
            ("SLURM_PROCID", "16"),
            "SLURM_PROCID=16 but SLURM_NTASKS=16",
        ),
        (("SLURM_LOCALID", "-1"), "SLURM_LOCALID=\"-1\""),
        (
            ("SLURM_JOB_NODELIST", "dcu[07-"),
            "SLURM_JOB_NODELIST=\"dcu[07-\"",
        ),
        (
            ("SLURM_JOB_NODELIST", ""),
            "SLURM_JOB_NODELIST, which gives rank 0's host",
        ),
        (("SLURM_JOB_ID", "12a"), "SLURM_JOB_ID=\"12a\""),
        (("MASTER_PORT", "0"), "MASTER_PORT=\"0\""),
    ] {
        let e = LaunchEnv::from_lookup(slurm(&[change]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{change:?}: {e}");
    }
}
