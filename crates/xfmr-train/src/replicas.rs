//! This process's replicas of a run: the device of each, and the run of all of them, one thread
//! per replica (see [`crate::distributed`] for what the replicas compute together).

use std::path::Path;
use std::thread;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend, Device as _, DeviceId, DeviceOps};

use crate::objective::{ModelOf, Objective};
use crate::trainer::{Observer, RunSummary, TrainConfig, TrainError, Trainer};
use crate::{DataParallel, DataParallelConfig};

/// The devices of a process's replicas.
#[derive(Debug, Clone)]
pub struct LocalDevices<D> {
    /// One device per replica.
    pub devices: Vec<D>,
    /// Whether the replicas share one device (the backend has fewer devices than replicas):
    /// correct, but no faster than one replica.
    pub shared: bool,
}

/// The devices of `n` replicas: devices `0..n` of the backend's default kind, else of its
/// discrete GPUs (kind 0), else the default device `n` times (a CPU backend has one device: its
/// replicas share it, which tests data parallelism but is no faster than one).
///
/// # Errors
/// [`TrainError::InvalidConfig`] for `n = 0` or more devices than a device index holds.
pub fn local_devices<B: Backend>(n: u32) -> Result<LocalDevices<B::Device>, TrainError> {
    let default = B::Device::default();
    if n == 0 {
        return Err(TrainError::InvalidConfig {
            field: "devices",
            value: "0".into(),
            expected: "at least one device",
        });
    }
    if n == 1 {
        return Ok(LocalDevices {
            devices: vec![default],
            shared: false,
        });
    }
    let index = |i: u32| {
        u16::try_from(i).map_err(|_| TrainError::InvalidConfig {
            field: "devices",
            value: n.to_string(),
            expected: "at most 65,536",
        })
    };
    for kind in [default.id().type_id, 0] {
        if B::device_count(kind) < n as usize {
            continue;
        }
        let devices = (0..n)
            .map(|i| Ok(B::Device::from_id(DeviceId::new(kind, index(i)?))))
            .collect::<Result<Vec<_>, TrainError>>()?;
        // A kind whose index means nothing (wgpu's `DefaultDevice`) gives one device n times.
        let mut ids: Vec<DeviceId> = devices.iter().map(DeviceOps::id).collect();
        ids.sort();
        ids.dedup();
        if ids.len() == devices.len() {
            return Ok(LocalDevices {
                devices,
                shared: false,
            });
        }
    }
    Ok(LocalDevices {
        devices: vec![default; n as usize],
        shared: true,
    })
}

/// One trainer per device, each opened with [`Trainer::open`] (resumed from `run_dir`'s newest
/// checkpoint, or fresh), one after another: each fresh one draws its initial weights from the
/// backend's generator after seeding it, and concurrent draws would interleave.
///
/// # Errors
/// As [`Trainer::open`].
pub fn open_replicas<B: AutodiffBackend, O: Objective>(
    run_dir: &Path,
    objective: &O,
    config: &TrainConfig,
    examples: &[O::Example],
    devices: &[B::Device],
) -> Result<Vec<Trainer<B, O>>, TrainError>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    devices
        .iter()
        .map(|device| {
            Trainer::open(
                run_dir,
                objective.clone(),
                config.clone(),
                examples.to_vec(),
                device,
            )
        })
        .collect()
}

/// Runs this process's replicas ([`Trainer::run`]), replica `i` with `observers[i]`, each on a
/// thread of its own. With `data_parallel`, replica `i` first joins the run as this process's
/// device `i` and checks every `(value, what)` of `agreements` against the other replicas (the
/// vocabulary's fingerprint, say); without it, `trainers` holds one trainer, which trains alone
/// on the calling thread.
///
/// A replica that fails while the others may be waiting for it in a collective operation calls
/// `on_failure` at once (a program may end the process there, rather than let the others wait
/// out their timeout); its error is returned when every thread has ended.
///
/// Several replicas each run in a rayon pool of their own, of [`replica_threads`] threads, so
/// that the host kernels a replica calls run on its own threads: on the global pool, every
/// parallel region of a replica's step was handed to the pool's workers and its thread put to
/// sleep until they finished, two context switches per region and the replicas' regions
/// queued behind each other (7% of a two-replica lm step's samples in the kernel's scheduler
/// on two cores, docs/training.md). One replica runs on the global pool.
///
/// Returns the first replica's summary (the leader's on node 0).
///
/// # Errors
/// The first replica's error, else another's.
///
/// # Panics
/// If `observers` and `trainers` differ in length, or several trainers train without
/// `data_parallel`.
pub fn run_replicas<B: AutodiffBackend, O: Objective>(
    trainers: Vec<Trainer<B, O>>,
    data_parallel: Option<&DataParallelConfig>,
    agreements: &[(u64, &str)],
    run_dir: &Path,
    valid: &[O::Example],
    observers: Vec<&mut (dyn Observer + Send)>,
    on_failure: &(dyn Fn(&TrainError) + Sync),
) -> Result<RunSummary, TrainError>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    assert_eq!(trainers.len(), observers.len(), "one observer per replica");
    assert!(
        data_parallel.is_some() || trainers.len() == 1,
        "several replicas need a data-parallel configuration"
    );
    let run_one = |index: usize, trainer: Trainer<B, O>, observer: &mut (dyn Observer + Send)| {
        let result = (|| {
            let mut trainer = match data_parallel {
                Some(config) => {
                    let device = trainer.device().clone();
                    let run = DataParallel::join(config.clone(), index as u32, &device)?;
                    for &(value, what) in agreements {
                        run.agree(value, what)?;
                    }
                    trainer.with_data_parallel(run)?
                }
                None => trainer,
            };
            trainer.run(run_dir, valid, observer)
        })();
        if let (Err(e), Some(_)) = (&result, data_parallel) {
            on_failure(e);
        }
        result
    };
    let trainers_len = trainers.len();
    let threads = replica_threads(trainers_len);
    // Replica `i` on a pool of its own (several replicas), else on the caller's.
    let run_pooled =
        |index: usize, trainer: Trainer<B, O>, observer: &mut (dyn Observer + Send)| {
            let pool = (trainers_len > 1).then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |t| format!("xfmr-replica-{index}-{t}"))
                    .build()
            });
            match pool {
                Some(Ok(pool)) => pool.install(|| run_one(index, trainer, observer)),
                // A pool that cannot start (no threads left): the global one, as one replica.
                Some(Err(_)) | None => run_one(index, trainer, observer),
            }
        };
    thread::scope(|scope| {
        let mut replicas = trainers.into_iter().zip(observers).enumerate();
        let (_, (first, first_observer)) = replicas.next().expect("at least one replica");
        let others: Vec<_> = replicas
            .map(|(index, (trainer, observer))| {
                let run_pooled = &run_pooled;
                scope.spawn(move || run_pooled(index, trainer, observer))
            })
            .collect();
        let summary = run_pooled(0, first, first_observer);
        let mut failure = summary.as_ref().err().map(ToString::to_string);
        for other in others {
            match other.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failure = failure.or(Some(e.to_string())),
                Err(_) => failure = failure.or(Some("a replica's thread panicked".into())),
            }
        }
        match (summary, failure) {
            (Ok(summary), None) => Ok(summary),
            (Err(e), _) => Err(e),
            (Ok(_), Some(problem)) => Err(TrainError::Replica(problem)),
        }
    })
}

/// The threads of each replica's pool when `replicas` share this process: the global rayon
/// pool's threads (`RAYON_NUM_THREADS`, else one per core) shared out, at least one each.
pub fn replica_threads(replicas: usize) -> usize {
    (rayon::current_num_threads() / replicas.max(1)).max(1)
}
