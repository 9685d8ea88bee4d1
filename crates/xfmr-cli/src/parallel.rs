//! Data-parallel `xfmr train`: this process's replicas (one per device) and joining the run
//! (`xfmr_train::distributed` does the collective work).

use std::time::Duration;

// `Device` brings `from_id` into scope.
use xfmr::burn::tensor::backend::{AutodiffBackend, Backend, Device as _, DeviceId, DeviceOps};
use xfmr_train::{DataParallel, DataParallelConfig, Trainer};

use crate::train::TrainArgs;

/// Prints a replica's error and ends the process: the other replicas of this process may be
/// waiting for it in a collective operation, and would otherwise wait until they time out.
pub(crate) fn fail_fast<T>(error: String) -> T {
    eprintln!("error: {error}");
    std::process::exit(1)
}

/// The devices of this process's `n` replicas: devices `0..n` of the backend's default kind,
/// else of its discrete GPUs (kind 0), else the default device `n` times (a CPU backend has one
/// device: its replicas share it, which tests data parallelism but is no faster than one).
pub(crate) fn local_devices<B: Backend>(n: u32) -> Result<Vec<B::Device>, String> {
    let default = B::Device::default();
    if n <= 1 {
        return match n {
            1 => Ok(vec![default]),
            _ => Err("--devices 0: at least one device".to_string()),
        };
    }
    let index = |i: u32| u16::try_from(i).map_err(|_| format!("--devices {n}: too many"));
    for kind in [default.id().type_id, 0] {
        if B::device_count(kind) < n as usize {
            continue;
        }
        let devices = (0..n)
            .map(|i| Ok(B::Device::from_id(DeviceId::new(kind, index(i)?))))
            .collect::<Result<Vec<_>, String>>()?;
        // A kind whose index means nothing (wgpu's `DefaultDevice`) gives one device n times.
        let mut ids: Vec<DeviceId> = devices.iter().map(DeviceOps::id).collect();
        ids.sort();
        ids.dedup();
        if ids.len() == devices.len() {
            eprintln!("{n} replicas on {devices:?}");
            return Ok(devices);
        }
    }
    eprintln!(
        "the backend has fewer than {n} devices: the {n} replicas share {default:?} (correct, \
         but no faster than one)"
    );
    Ok(vec![default; n as usize])
}

/// Joins the data-parallel run of `args` as this process's replica `device_index` (node 0's
/// first replica starts the coordinator) and checks that every replica learnt or loaded the
/// same vocabulary (`vocabulary`, its fingerprint).
pub(crate) fn join_run<B: AutodiffBackend>(
    trainer: Trainer<B>,
    args: &TrainArgs,
    device_index: u32,
    vocabulary: u64,
    device: &B::Device,
) -> Result<Trainer<B>, String> {
    let port = match args.data_port {
        Some(port) => port,
        None => u16::try_from(29501 + args.rank)
            .map_err(|_| format!("--rank {} leaves no default --data-port", args.rank))?,
    };
    let config = DataParallelConfig::new(
        args.nodes,
        args.rank,
        args.coordinator.as_str(),
        args.host.as_str(),
        port,
    )
    .with_devices(args.devices)
    .with_timeout(Duration::from_secs(args.peer_timeout));
    if device_index == 0 {
        eprintln!(
            "rank {} of {} ({} device(s)): joining the run coordinated at {} (serving on \
             {}:{port})",
            args.rank, args.nodes, args.devices, args.coordinator, args.host
        );
    }
    // burn-communication installs a subscriber printing every transfer (INFO) on stdout unless
    // one is already there: ours keeps warnings and errors, on stderr.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
    let run = DataParallel::<B::InnerBackend>::join(config, device_index, device)
        .map_err(|e| e.to_string())?;
    run.agree(vocabulary, "the BPE vocabulary")
        .map_err(|e| e.to_string())?;
    trainer.with_data_parallel(run).map_err(|e| e.to_string())
}
