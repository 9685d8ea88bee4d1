//! The data-parallel options of `xfmr train` (docs/distributed.md); the replicas themselves are
//! the library's (`xfmr_train::replicas`).

use std::time::Duration;

use anyhow::{anyhow, Result};
use xfmr_train::{DataParallelConfig, TrainError};

/// Where this process sits in a data-parallel run.
#[derive(clap::Args, Debug)]
pub struct ParallelArgs {
    /// Processes in a data-parallel run, one per machine or per process slot
    /// (docs/distributed.md); 1 trains alone.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// This process's rank in `0..nodes`. Rank 0 hosts the coordinator and alone writes
    /// checkpoints, metrics, pictures and the final model; the others read `--out` only to
    /// resume from its last checkpoint.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// The coordinator as every rank reaches it, `host:port` (rank 0 listens on the port).
    #[arg(long, default_value = "127.0.0.1:29500")]
    pub coordinator: String,
    /// This process's host name or address as the other ranks reach it.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port this rank serves its gradients on (default: 29501 + rank).
    #[arg(long)]
    pub data_port: Option<u16>,
    /// Seconds a rank waits for the others in a collective operation before it fails, naming
    /// the ranks it waited for.
    #[arg(long, default_value_t = 600)]
    pub peer_timeout: u64,
    /// Model replicas in this process, each on its own thread with its share of every batch
    /// (docs/distributed.md): one per device, devices `0..N` of the backend's default kind,
    /// else of its discrete GPUs. The CPU backends have one device, which the replicas share,
    /// each on its own cores: their default is one replica per core, at most 8 (the step's work
    /// split over the cores where one replica leaves some idle), when this process trains
    /// alone. Default: 1 on a GPU backend and with --nodes above 1. With
    /// dropout, the replicas of one process draw their masks from burn's one generator in
    /// thread order: a resumed run is then correct but not the uninterrupted one step for step
    /// (`--devices 1` resumes exactly).
    #[arg(long)]
    pub devices: Option<u32>,
}

impl ParallelArgs {
    /// The data-parallel configuration, `None` when training alone. Installs a log subscriber
    /// for burn's collective (warnings and errors on stderr: without one, burn-communication
    /// installs its own, printing every transfer on stdout).
    pub fn config(&self, devices: u32) -> Result<Option<DataParallelConfig>> {
        if self.nodes <= 1 && devices <= 1 {
            return Ok(None);
        }
        let port = match self.data_port {
            Some(port) => port,
            None => u16::try_from(29501 + self.rank)
                .map_err(|_| anyhow!("--rank {} leaves no default --data-port", self.rank))?,
        };
        if self.nodes > 1 {
            eprintln!(
                "rank {} of {} ({devices} replica(s)): joining the run coordinated at {} \
                 (serving on {}:{port})",
                self.rank, self.nodes, self.coordinator, self.host
            );
        }
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .try_init();
        Ok(Some(
            DataParallelConfig::new(
                self.nodes,
                self.rank,
                self.coordinator.as_str(),
                self.host.as_str(),
                port,
            )
            .with_devices(devices)
            .with_timeout(Duration::from_secs(self.peer_timeout)),
        ))
    }

    /// The replicas of this process: `--devices`, else on a CPU backend alone one per core (at
    /// most [`MAX_CPU_REPLICAS`]), and one on a GPU backend or in a run of several processes
    /// (whose ranks must agree on it, and may differ in cores).
    pub fn replicas(&self, cpu: bool) -> u32 {
        self.devices.unwrap_or_else(|| {
            if cpu && self.nodes <= 1 {
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get() as u32)
                    .min(MAX_CPU_REPLICAS)
            } else {
                1
            }
        })
    }
}

/// The most replicas the CPU default runs: each holds a copy of the model and takes a share of
/// every micro-batch, and beyond a few the shares shrink to a sentence or two (measured only on
/// two cores; `--devices` sets more).
pub const MAX_CPU_REPLICAS: u32 = 8;

/// Prints a replica's error and ends the process: the other replicas of this process may be
/// waiting for it in a collective operation, and would otherwise wait until they time out.
pub(crate) fn fail_fast(error: &TrainError) {
    eprintln!("error: {error}");
    std::process::exit(1)
}
