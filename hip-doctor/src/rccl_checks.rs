//! The "Several devices (RCCL)" section: where RCCL was found (path, version) or every path
//! tried; with two or more devices, `HSA_FORCE_FINE_GRAIN_PCIE`, the peer-access matrix, and an
//! all-reduce and an all-gather per type across every device, checked element by element; with
//! `--bench`, the all-reduce bus bandwidth (nccl-tests' definition).

use std::time::Duration;

use half::{bf16, f16};
use hip_rt::comm::check::{self, CheckElement, Collective};
use hip_rt::comm::ReduceOp;
use hip_rt::{Comm, Device, Stream, StreamOptions};
use hip_sys::search::SearchReport;

use crate::diagnose::DeviceState;
use crate::report::{Item, Json, Section, Status};

/// The section's title.
pub const TITLE: &str = "Several devices (RCCL)";

/// The variable DTK's RCCL needs over PCIe (its low-latency protocol hangs without it).
pub const FINE_GRAIN_VAR: &str = "HSA_FORCE_FINE_GRAIN_PCIE";

/// How long a check's collective may take before it counts as hung.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the section for the devices found.
pub fn section(devices: &DeviceState, bench: bool) -> Section {
    let (ordinals, emulated) = match devices {
        DeviceState::Found(list) => (
            list.iter().map(|d| d.ordinal).collect::<Vec<_>>(),
            devices.all_emulated(),
        ),
        _ => (Vec::new(), false),
    };
    let several = ordinals.len() >= 2;
    let mut items = Vec::new();
    let rccl = hip_sys::rccl::rccl();
    items.push(rccl_item(
        rccl.as_ref()
            .map(|r| (r.path().display().to_string(), r.version().to_string())),
        &hip_sys::rccl::rccl_search_report(),
        several,
    ));
    if !several {
        items.push(Item::info(
            "collectives",
            format!(
                "{} device(s) visible: the peer-access and collective checks need two or more",
                ordinals.len()
            ),
        ));
        return Section {
            title: TITLE.into(),
            items,
        };
    }
    items.push(fine_grain_item(
        std::env::var(FINE_GRAIN_VAR).ok().as_deref(),
        emulated,
    ));
    items.push(peer_item(&ordinals));
    if rccl.is_ok() {
        items.extend(collective_items(&ordinals, bench, emulated));
    }
    Section {
        title: TITLE.into(),
        items,
    }
}

/// The RCCL row: PASS with path and version; otherwise the paths tried (a WARN when several
/// devices could use it, INFO when not).
pub fn rccl_item(
    loaded: Result<(String, String), &hip_sys::Error>,
    report: &SearchReport,
    several: bool,
) -> Item {
    match loaded {
        Ok((path, version)) => Item::pass("RCCL", format!("{path} (RCCL {version})"))
            .with_fact("path", Json::from(path))
            .with_fact("version", Json::from(version)),
        Err(hip_sys::Error::NotFound { .. }) => {
            let mut detail = "not found; looked in:".to_string();
            for line in crate::hip::attempt_lines(&report.attempts) {
                detail.push_str("\n  ");
                detail.push_str(&line);
            }
            let item = if several {
                Item::warn("RCCL", detail)
            } else {
                Item::info(
                    "RCCL",
                    format!("{detail}\n(only needed with several devices)"),
                )
            };
            item.with_hint(
                "point HIPK_RCCL_LIBRARY at librccl.so (DTK: /opt/dtk/lib/librccl.so.1 or /opt/dtk/rccl/lib/librccl.so), or `source /opt/dtk/env.sh`",
            )
        }
        Err(e) => Item::fail("RCCL", e.to_string()),
    }
}

/// The `HSA_FORCE_FINE_GRAIN_PCIE` row for several devices.
pub fn fine_grain_item(value: Option<&str>, emulated: bool) -> Item {
    let name = FINE_GRAIN_VAR;
    match value {
        Some("1") => Item::pass(name, "1"),
        _ if emulated => Item::info(
            name,
            format!(
                "{} (not needed on hip-emu; on DCUs set it to 1)",
                value.unwrap_or("unset")
            ),
        ),
        other => Item::warn(
            name,
            format!(
                "{}: with several DCUs on PCIe, RCCL's low-latency protocol is reported to hang unless it is 1",
                other.map_or("unset".to_string(), |v| format!("{v:?}"))
            ),
        )
        .with_hint(format!("export {name}=1 before starting multi-device jobs")),
    }
}

/// `hipDeviceCanAccessPeer` for every ordered pair, as rows of `Y`/`n` (`-` on the diagonal).
pub fn peer_matrix_text(ordinals: &[usize], can: &[Vec<bool>]) -> String {
    let mut text = format!(
        "     {}",
        ordinals
            .iter()
            .map(|o| format!("{o:>3}"))
            .collect::<String>()
    );
    for (i, row) in can.iter().enumerate() {
        text.push_str(&format!("\n  {:>3}", ordinals[i]));
        for (j, &ok) in row.iter().enumerate() {
            let mark = if i == j {
                "-"
            } else if ok {
                "Y"
            } else {
                "n"
            };
            text.push_str(&format!("{mark:>3}"));
        }
    }
    text
}

fn peer_item(ordinals: &[usize]) -> Item {
    let f = match hip_sys::sym!(hipDeviceCanAccessPeer) {
        Ok(f) => f,
        Err(e) => return Item::fail("peer access", e.to_string()),
    };
    let mut can = vec![vec![false; ordinals.len()]; ordinals.len()];
    for (i, &a) in ordinals.iter().enumerate() {
        for (j, &b) in ordinals.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut value = 0;
            // SAFETY: hipDeviceCanAccessPeer writes one int; both ordinals are visible devices.
            let status = unsafe { f(&mut value, a as i32, b as i32) };
            if let Err(e) = status.result() {
                return Item::fail(
                    "peer access",
                    format!("hipDeviceCanAccessPeer({a}, {b}): {e}"),
                );
            }
            can[i][j] = value != 0;
        }
    }
    let all = can
        .iter()
        .enumerate()
        .all(|(i, r)| r.iter().enumerate().all(|(j, &v)| i == j || v));
    let text = format!(
        "{}\n{}",
        if all {
            "every device can access every other"
        } else {
            "some pairs cannot access each other directly (RCCL then stages through the host)"
        },
        peer_matrix_text(ordinals, &can)
    );
    let item = Item::new(
        "peer access",
        if all { Status::Info } else { Status::Warn },
        text,
    );
    item.with_fact("matrix", Json::from(can))
}

/// The communicators over every device and their streams, or the FAIL row.
fn setup(ordinals: &[usize]) -> Result<(Vec<Comm>, Vec<Stream>), Item> {
    let fail = |e: hip_rt::Error| Item::fail("communicators", e.to_string());
    let devices: Vec<Device> = ordinals
        .iter()
        .map(|&o| Device::get(o as i32))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    let comms = Comm::init_all(&devices).map_err(fail)?;
    for c in &comms {
        c.set_timeout(CHECK_TIMEOUT);
    }
    let streams = devices
        .iter()
        .map(|d| Stream::new(d, StreamOptions::default()))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    Ok((comms, streams))
}

fn check_row<T: CheckElement>(comms: &[Comm], streams: &[Stream], coll: Collective) -> Item {
    let name = format!("{}_{}", coll.name(), T::NAME);
    // 4099 elements per rank: odd, past any vector width.
    let bytes = 4099 * comms.len() * std::mem::size_of::<T>();
    match check::measure::<T>(comms, streams, coll, ReduceOp::Sum, bytes, false, 0, 1) {
        Ok(m) if m.wrong == 0 => Item::pass(
            name,
            format!(
                "{} ranks, {} elements, every value right",
                comms.len(),
                m.count
            ),
        ),
        Ok(m) => Item::fail(
            name,
            format!(
                "{} of {} elements wrong across {} ranks",
                m.wrong,
                m.count * comms.len(),
                comms.len()
            ),
        ),
        Err(e) => Item::fail(name, e.to_string()),
    }
}

fn collective_items(ordinals: &[usize], bench: bool, emulated: bool) -> Vec<Item> {
    let (comms, streams) = match setup(ordinals) {
        Ok(v) => v,
        Err(item) => return vec![item],
    };
    let mut items = Vec::new();
    for coll in [Collective::AllReduce, Collective::AllGather] {
        items.push(check_row::<f32>(&comms, &streams, coll));
        items.push(check_row::<f16>(&comms, &streams, coll));
        items.push(check_row::<bf16>(&comms, &streams, coll));
        items.push(check_row::<i32>(&comms, &streams, coll));
        items.push(check_row::<u8>(&comms, &streams, coll));
    }
    if bench {
        let bytes = if emulated { 8 << 20 } else { 256 << 20 };
        let label = if emulated {
            format!(" [{}]", hip_rt::EMULATED_FIGURE_LABEL)
        } else {
            String::new()
        };
        for coll in [Collective::AllReduce, Collective::AllGather] {
            let name = format!("{} bus bandwidth", coll.name());
            let item = match check::measure::<f32>(&comms, &streams, coll, ReduceOp::Sum, bytes, false, 2, 10) {
                Ok(m) => Item::info(
                    name,
                    format!(
                        "{:.2} GB/s bus, {:.2} GB/s algorithm, {} MiB f32 over {} ranks, {:.1} us{label}",
                        m.busbw, m.algbw, m.bytes >> 20, comms.len(), m.time_us
                    ),
                )
                .with_fact("busbw_gbps", Json::from(m.busbw)),
                Err(e) => Item::fail(name, e.to_string()),
            };
            items.push(item);
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fine_grain_warns_only_when_unset_on_real_devices() {
        assert_eq!(fine_grain_item(Some("1"), false).status, Status::Pass);
        let unset = fine_grain_item(None, false);
        assert_eq!(unset.status, Status::Warn);
        assert!(unset.detail.contains("unset") && unset.hint.unwrap().contains("=1"));
        assert_eq!(fine_grain_item(Some("0"), false).status, Status::Warn);
        assert_eq!(fine_grain_item(None, true).status, Status::Info);
    }

    #[test]
    fn peer_matrix_marks_each_pair() {
        let text = peer_matrix_text(
            &[0, 1, 2],
            &[
                vec![false, true, true],
                vec![true, false, false],
                vec![true, true, false],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "       0  1  2");
        assert_eq!(lines[1], "    0  -  Y  Y");
        assert_eq!(lines[2], "    1  Y  -  n");
        assert_eq!(lines[3], "    2  Y  Y  -");
    }

    #[test]
    fn a_missing_rccl_lists_the_paths_tried() {
        let report =
            hip_sys::search::search(&hip_sys::rccl::RCCL, &|_| None, &|_| false, &mut |_| {
                Err::<(), _>("not found".to_string())
            })
            .1;
        let err = hip_sys::Error::NotFound {
            report: Box::new(report.clone()),
        };
        let item = rccl_item(Err(&err), &report, true);
        assert_eq!(item.status, Status::Warn);
        assert!(
            item.detail.contains("/opt/dtk/rccl/lib/{librccl.so"),
            "{}",
            item.detail
        );
        assert!(item.hint.as_deref().unwrap().contains("HIPK_RCCL_LIBRARY"));
        assert_eq!(rccl_item(Err(&err), &report, false).status, Status::Info);
        let ok = rccl_item(
            Ok(("/opt/dtk/lib/librccl.so.1".into(), "2.18.3".into())),
            &report,
            true,
        );
        assert_eq!(ok.status, Status::Pass);
        assert_eq!(ok.detail, "/opt/dtk/lib/librccl.so.1 (RCCL 2.18.3)");
    }
}
