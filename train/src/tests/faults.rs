//! Faults of a data-parallel run (issue 36): a rank stopped, failing, late, forged or started
//! with other settings must end every other rank within the communicator's timeout
//! (`HIPK_COMM_TIMEOUT_S`, short here) with an error naming it, never a hang; and ranks started
//! by Slurm's `srun` (only `SLURM_*` variables set) train together.
//!
//! Each case runs its ranks as child processes of this test binary on hip-emu's emulated
//! devices and RCCL. `HIPK_EMU_RCCL_TIMEOUT_MS` is set far past the test's limits: hip-emu's
//! own watchdog then never ends a wait, as a real RCCL (which has none) would not.

use super::{emu_setup, run_tiny, serial, strs};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The child's flags, separated by `\x1f`.
const CHILD_FLAGS: &str = "TRAIN_GPT2_FAULT_CHILD";
/// Every rank's secret (the launcher's job).
const SECRET: &str = "fault-tests-secret-0123456789abcdef";
/// hip-emu's watchdog, far past any limit below.
const NO_WATCHDOG: (&str, &str) = ("HIPK_EMU_RCCL_TIMEOUT_MS", "600000");

/// In a child: train with the parent's flags, print the outcome, exit with the trainer's
/// status. Returns false in the parent.
fn child() -> bool {
    let Ok(flags) = std::env::var(CHILD_FLAGS) else {
        return false;
    };
    let flags: Vec<String> = flags.split('\x1f').map(String::from).collect();
    match run_tiny(&flags) {
        Ok(_) => println!("CHILD-OK"),
        Err(e) => {
            eprintln!("CHILD-ERROR: {e}");
            std::process::exit(i32::from(e.exit_code()));
        }
    }
    true
}

/// Start test `name` as a child training with `flags` and the variables `env`.
fn spawn(name: &str, flags: &[&str], env: &[(&str, String)]) -> Child {
    emu_setup();
    let mut all = strs(&["--seq", "16", "--lr", "1e-2", "--batch", "2"]);
    all.extend(strs(flags));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_FLAGS, all.join("\x1f"))
        .env("HIPK_RDZV_SECRET", SECRET)
        .env(NO_WATCHDOG.0, NO_WATCHDOG.1)
        .env_remove("HIPK_RDZV_PORT")
        .env_remove("TORCHELASTIC_USE_AGENT_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// torchrun's variables for rank `rank` of 2 at `port`, and a timeout of `timeout_s`.
fn torchrun(rank: usize, port: u16, timeout_s: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", rank.to_string()),
        ("WORLD_SIZE", "2".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("HIPK_COMM_TIMEOUT_S", timeout_s.into()),
    ]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// Wait for `child` at most `limit` (then kill it and fail): (success, stdout + stderr,
/// time taken).
fn finish(mut child: Child, limit: Duration) -> (bool, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            return (status.success(), text, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "a rank did not exit within {limit:?} (a hang):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Read `child`'s stdout until a line starts with `prefix`; the lines read.
fn read_until(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut lines = BufReader::new(out).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen += &line;
        seen.push('\n');
        if line.starts_with(prefix) {
            break;
        }
    }
    // Keep draining in the background so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    seen
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {}", child.id());
}

#[test]
fn a_stopped_rank_ends_the_other_within_the_timeout_naming_it() {
    const NAME: &str = "tests::faults::a_stopped_rank_ends_the_other_within_the_timeout_naming_it";
    if child() {
        return;
    }
    let _s = serial();
    let port = free_port();
    let mut rank1 = spawn(NAME, &["--steps", "1000"], &torchrun(1, port, "8"));
    let mut rank0 = spawn(NAME, &["--steps", "1000"], &torchrun(0, port, "8"));
    let seen = read_until(&mut rank0, "step 2/");
    assert!(
        seen.contains("step 2/"),
        "rank 0 never reached step 2:\n{seen}"
    );
    signal(&rank1, "-STOP");
    let (ok, out, took) = finish(rank0, Duration::from_secs(90));
    signal(&rank1, "-KILL");
    let _ = rank1.wait();
    assert!(!ok, "rank 0 trained on without rank 1:\n{out}");
    assert!(
        took < Duration::from_secs(40),
        "rank 0 took {took:?}:\n{out}"
    );
    assert!(
        out.contains("rank 1 sent nothing for"),
        "rank 0's error does not name rank 1:\n{out}"
    );
}

#[test]
fn a_failing_rank_of_devices_ends_the_others_naming_it() {
    const NAME: &str = "tests::faults::a_failing_rank_of_devices_ends_the_others_naming_it";
    if child() {
        return;
    }
    let _s = serial();
    // Rank 0 alone writes the log: /dev/full fails its first write (a full disk) while rank 1
    // goes on into the next step's collectives.
    let flags = ["--steps", "200", "--devices", "0,1", "--log", "/dev/full"];
    let c = spawn(NAME, &flags, &[("HIPK_COMM_TIMEOUT_S", "60".into())]);
    let (ok, out, took) = finish(c, Duration::from_secs(120));
    assert!(!ok, "{out}");
    assert!(took < Duration::from_secs(45), "took {took:?}:\n{out}");
    assert!(
        out.contains("/dev/full") && out.contains("CHILD-ERROR"),
        "the error does not name the failing write:\n{out}"
    );
}

#[test]
fn a_rank_with_other_settings_is_refused_naming_the_setting() {
    const NAME: &str = "tests::faults::a_rank_with_other_settings_is_refused_naming_the_setting";
    if child() {
        return;
    }
    let _s = serial();
    let port = free_port();
    let rank1 = spawn(
        NAME,
        &["--steps", "2", "--grad-clip", "1"],
        &torchrun(1, port, "60"),
    );
    let rank0 = spawn(NAME, &["--steps", "2"], &torchrun(0, port, "60"));
    for (rank, c) in [(0, rank0), (1, rank1)] {
        let (ok, out, _) = finish(c, Duration::from_secs(120));
        assert!(
            !ok,
            "rank {rank} trained although --grad-clip differs:\n{out}"
        );
        assert!(
            out.contains("--grad-clip differs: rank 0 has 0e0, rank 1 has 1e0"),
            "rank {rank}:\n{out}"
        );
    }
}

#[test]
fn a_forged_rank_is_dropped_and_the_real_one_trains() {
    const NAME: &str = "tests::faults::a_forged_rank_is_dropped_and_the_real_one_trains";
    if child() {
        return;
    }
    let _s = serial();
    let port = free_port();
    let mut forged_env = torchrun(1, port, "60");
    forged_env.push((
        "HIPK_RDZV_SECRET",
        "not the job's secret, but long enough".into(),
    ));
    let forger = spawn(NAME, &["--steps", "2"], &forged_env);
    let rank0 = spawn(NAME, &["--steps", "2"], &torchrun(0, port, "60"));
    let (ok, out, _) = finish(forger, Duration::from_secs(120));
    assert!(
        !ok && out.contains("did not prove that it holds this job's secret"),
        "{out}"
    );
    let rank1 = spawn(NAME, &["--steps", "2"], &torchrun(1, port, "60"));
    for (rank, c) in [(0, rank0), (1, rank1)] {
        let (ok, out, _) = finish(c, Duration::from_secs(180));
        assert!(ok, "rank {rank}:\n{out}");
    }
}

#[test]
fn a_late_or_missing_rank_ends_the_other_naming_it() {
    const NAME: &str = "tests::faults::a_late_or_missing_rank_ends_the_other_naming_it";
    if child() {
        return;
    }
    let _s = serial();
    let port = free_port();
    let rank0 = spawn(NAME, &["--steps", "2"], &torchrun(0, port, "3"));
    let (ok, out, took) = finish(rank0, Duration::from_secs(60));
    assert!(!ok && out.contains("rank(s) [1] never connected"), "{out}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    // Rank 1 started after rank 0 gave up.
    let rank1 = spawn(NAME, &["--steps", "2"], &torchrun(1, port, "3"));
    let (ok, out, took) = finish(rank1, Duration::from_secs(60));
    assert!(!ok && out.contains("got no unique id from rank 0"), "{out}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn bad_timeouts_and_ports_from_the_environment_are_usage_errors() {
    const NAME: &str =
        "tests::faults::bad_timeouts_and_ports_from_the_environment_are_usage_errors";
    if child() {
        return;
    }
    let _s = serial();
    let port = free_port();
    for (var, value) in [
        ("HIPK_COMM_TIMEOUT_S", "1e30"),
        ("HIPK_COMM_TIMEOUT_S", "abc"),
        ("HIPK_COMM_TIMEOUT_S", "-5"),
        ("HIPK_RDZV_PORT", "70000"),
        ("WORLD_SIZE", "4000000000000"),
    ] {
        let mut env = torchrun(0, port, "60");
        env.retain(|(k, _)| *k != var);
        env.push((var, value.into()));
        let mut c = spawn(NAME, &["--steps", "1"], &env);
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = c.wait().unwrap();
        assert_eq!(status.code(), Some(2), "{var}={value}: {err}");
        assert!(
            err.contains(&format!("{var}={value}")) || err.contains(&format!("{var}={value:?}")),
            "{var}={value}: {err}"
        );
    }
}

#[test]
fn ranks_started_by_srun_train_with_only_slurms_variables() {
    const NAME: &str = "tests::faults::ranks_started_by_srun_train_with_only_slurms_variables";
    if child() {
        return;
    }
    let _s = serial();
    // A free port that a job id maps to: 20000 + id mod 20000.
    let port = (0..200)
        .map(|_| free_port())
        .find(|p| (20000..40000).contains(p))
        .or_else(|| {
            (20000..40000u16).find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        })
        .unwrap();
    let job_id = 1_000_000 + u64::from(port - 20000);
    let ranks: Vec<Child> = (0..2)
        .map(|rank| {
            let env = vec![
                ("SLURM_PROCID", rank.to_string()),
                ("SLURM_NTASKS", "2".into()),
                ("SLURM_LOCALID", rank.to_string()),
                ("SLURM_JOB_NODELIST", "127.0.0.[1-2]".into()),
                ("SLURM_JOB_ID", job_id.to_string()),
                ("HIPK_COMM_TIMEOUT_S", "120".into()),
            ];
            spawn(NAME, &["--steps", "2"], &env)
        })
        .collect();
    for (rank, c) in ranks.into_iter().enumerate() {
        let (ok, out, _) = finish(c, Duration::from_secs(180));
        assert!(ok, "rank {rank}:\n{out}");
        assert_eq!(out.contains("step 2/2"), rank == 0, "rank {rank}:\n{out}");
    }
}
