//! Data-parallel training on burn's collective operations (the `burn-collective` crate, as
//! xfmr's patched copy `xfmr-burn-collective`: `vendor/PATCHED.md`): `nodes` processes (one per
//! machine, or several on one), each holding `devices` full replicas of the model, one per
//! device, each on its own thread.
//!
//! **Replicas.** Replica `r = node · devices + device` of `R = nodes · devices`. Node 0's device
//! 0 is the *leader*: the one replica that writes checkpoints and metrics.
//!
//! **What a step does.** Every replica draws the same micro-batches (the batch order is seeded)
//! and keeps its share of each one: rows `r, r + R, r + 2R, …`. Each replica weights its rows'
//! loss by `its target tokens / the whole step's target tokens`, exactly as the single-process
//! loop weights a micro-batch, so the gradients burn's all-reduce **sums** (parameter by
//! parameter, in the module's order) are the gradient of the whole step. Adam then takes the
//! same step on every replica from the same gradients: the replicas stay identical, and equal to
//! one process training on the union of the shares (up to float summation order; the tests
//! check ≤ 1e-4, the bound of the resume test, as burn's backward pass sums in a varying order).
//!
//! **Topology.** Within a process, burn's local collective server sums the devices' tensors.
//! Across processes burn needs a global orchestrator: node 0 starts it on the coordinator's
//! port, every node connects to it, and each node serves its sums to the others on its own data
//! port (`ws://<host>:<data_port>`), with burn's ring strategy.
//!
//! **Failures.** Every collective call runs under a timeout; when it expires, or burn reports an
//! error, the step fails with [`TrainError::Peer`] naming this replica, the step and the
//! replicas it was waiting for. Nothing is written by a failed step; the leader writes
//! checkpoints only between steps, atomically, so the run restarts from the last one.

use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{
    self as collective, AllReduceStrategy, CollectiveConfig, CollectiveError, PeerId,
    ReduceOperation,
};
use burn_communication::Address;
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// Where this process sits in a data-parallel run, and how to reach the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataParallelConfig {
    /// Number of processes (nodes) in the run.
    pub nodes: u32,
    /// This process's rank, `0..nodes`. Node 0 starts the coordinator, and its first device
    /// holds the replica that writes checkpoints and metrics.
    pub rank: u32,
    /// Replicas (devices) in each process, one thread each.
    pub devices: u32,
    /// The coordinator's address as every rank reaches it, `host:port` (rank 0 listens on the
    /// port).
    pub coordinator: String,
    /// This node's host name or IP address as the other nodes reach it.
    pub host: String,
    /// The port this node serves its tensors on.
    pub data_port: u16,
    /// How long a collective operation may wait for the other ranks.
    pub timeout: Duration,
}

impl DataParallelConfig {
    /// A run of `nodes` processes of one device each, this one `rank`, coordinated at
    /// `coordinator` (`host:port`), serving tensors at `host:data_port`; a 10-minute timeout.
    pub fn new(
        nodes: u32,
        rank: u32,
        coordinator: impl Into<String>,
        host: impl Into<String>,
        data_port: u16,
    ) -> Self {
        Self {
            nodes,
            rank,
            devices: 1,
            coordinator: coordinator.into(),
            host: host.into(),
            data_port,
            timeout: Duration::from_secs(600),
        }
    }

    /// Sets this process's rank.
    pub fn with_rank(mut self, rank: u32) -> Self {
        self.rank = rank;
        self
    }

    /// Sets the number of replicas (devices) in each process.
    pub fn with_devices(mut self, devices: u32) -> Self {
        self.devices = devices;
        self
    }

    /// Replicas in the whole run, `nodes · devices`.
    pub fn replicas(&self) -> u32 {
        self.nodes * self.devices
    }

    /// Sets the timeout of each collective operation.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The coordinator's port.
    fn coordinator_port(&self) -> Result<u16, TrainError> {
        self.coordinator
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .ok_or_else(|| TrainError::InvalidConfig {
                field: "coordinator",
                value: self.coordinator.clone(),
                expected: "host:port",
            })
    }

    fn check(&self) -> Result<(), TrainError> {
        if self.nodes == 0 {
            return Err(TrainError::InvalidConfig {
                field: "nodes",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        if self.devices == 0 || self.nodes.checked_mul(self.devices).is_none() {
            return Err(TrainError::InvalidConfig {
                field: "devices",
                value: self.devices.to_string(),
                expected: "at least 1 (and nodes × devices below 2³²)",
            });
        }
        if self.rank >= self.nodes {
            return Err(TrainError::InvalidConfig {
                field: "rank",
                value: self.rank.to_string(),
                expected: "below the number of nodes",
            });
        }
        if self.timeout.is_zero() {
            return Err(TrainError::InvalidConfig {
                field: "timeout",
                value: "0 s".into(),
                expected: "a positive duration",
            });
        }
        self.coordinator_port().map(drop)
    }
}

/// One replica's membership of a data-parallel run, on backend `B` (the *inner* backend of an
/// autodiff backend: gradients live there). Made by [`DataParallel::join`], given to
/// [`Trainer::with_data_parallel`](crate::Trainer::with_data_parallel).
#[derive(Debug)]
pub struct DataParallel<B: Backend> {
    config: DataParallelConfig,
    /// This process's device of the replica, `0..devices`.
    device_index: u32,
    peer: PeerId,
    device: B::Device,
    _backend: PhantomData<B>,
}

impl<B: Backend> DataParallel<B> {
    /// Joins the run as this process's replica `device_index` (on `device`): node 0's first
    /// replica starts the coordinator (when there are several nodes), then every replica
    /// registers with burn's collective and waits (up to the timeout) until all have. The
    /// `devices` replicas of a process must join at once, each from its own thread.
    ///
    /// # Errors
    /// [`TrainError::InvalidConfig`] for a rank outside `0..nodes`, a device outside
    /// `0..devices` or a coordinator without a port; [`TrainError::Peer`] when the others do
    /// not join in time.
    pub fn join(
        config: DataParallelConfig,
        device_index: u32,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        config.check()?;
        if device_index >= config.devices {
            return Err(TrainError::InvalidConfig {
                field: "device",
                value: device_index.to_string(),
                expected: "below the number of devices per process",
            });
        }
        let mut collective = CollectiveConfig::default().with_num_devices(config.devices as usize);
        if config.nodes > 1 {
            if config.rank == 0 && device_index == 0 {
                start_coordinator(config.coordinator_port()?);
            }
            collective = collective
                .with_num_nodes(config.nodes)
                .with_global_address(address(&config.coordinator))
                .with_node_address(address(&format!("{}:{}", config.host, config.data_port)))
                .with_data_service_port(config.data_port)
                .with_global_all_reduce_strategy(AllReduceStrategy::Ring);
        }
        let this = Self {
            peer: PeerId(config.rank * config.devices + device_index),
            device_index,
            config,
            device: device.clone(),
            _backend: PhantomData,
        };
        let (peer, device) = (this.peer, device.clone());
        this.wait("joining the run", move || {
            collective::register::<B>(peer, device, collective)
        })?;
        Ok(this)
    }

    /// This process's rank (its node).
    pub fn rank(&self) -> u32 {
        self.config.rank
    }

    /// Number of processes in the run.
    pub fn nodes(&self) -> u32 {
        self.config.nodes
    }

    /// This replica's device within its process, `0..devices`.
    pub fn device_index(&self) -> u32 {
        self.device_index
    }

    /// This replica's index in the run, `rank · devices + device`.
    pub fn replica(&self) -> u32 {
        self.peer.0
    }

    /// Replicas in the run, `nodes · devices`.
    pub fn replicas(&self) -> u32 {
        self.config.replicas()
    }

    /// Whether this is replica 0, the one that writes checkpoints and metrics.
    pub fn is_leader(&self) -> bool {
        self.peer.0 == 0
    }

    /// This replica's share of a micro-batch's rows: rows `r, r + R, …` for replica `r` of `R`.
    pub fn share(&self, rows: &[usize]) -> Vec<usize> {
        rows.iter()
            .skip(self.replica() as usize)
            .step_by(self.replicas() as usize)
            .copied()
            .collect()
    }

    /// The element-wise sum over all replicas of `values` (each replica passes its own).
    ///
    /// # Errors
    /// [`TrainError::Peer`] on a timeout or a collective error.
    pub fn sum(&self, values: &[f64], what: &str) -> Result<Vec<f64>, TrainError> {
        let data: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let tensor = Tensor::<B, 1>::from_data(TensorData::new(data, [values.len()]), &self.device);
        let primitive = tensor.into_primitive().tensor();
        let peer = self.peer;
        let summed = self.wait(what, move || {
            collective::all_reduce::<B>(peer, primitive, ReduceOperation::Sum)
        })?;
        let summed = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(summed));
        Ok(summed
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 data")
            .into_iter()
            .map(f64::from)
            .collect())
    }

    /// Fails unless every replica passed the same `value` (a step number, a vocabulary hash).
    ///
    /// # Errors
    /// [`TrainError::Peer`] naming `what` when the replicas disagree.
    pub fn agree(&self, value: u64, what: &str) -> Result<(), TrainError> {
        // 16-bit pieces are exact in f32, and so are their sums over up to 256 replicas.
        let pieces: Vec<f64> = (0..4)
            .map(|k| ((value >> (16 * k)) & 0xffff) as f64)
            .collect();
        let sums = self.sum(&pieces, what)?;
        let replicas = f64::from(self.replicas());
        if sums.iter().zip(&pieces).any(|(s, p)| *s != p * replicas) {
            return Err(self.peer_error(
                what,
                format!("the replicas disagree (this one has {value})"),
            ));
        }
        Ok(())
    }

    /// Sums the gradients of all replicas, parameter by parameter in the order of `params` (the
    /// module's visiting order, the same on every replica). burn's `GradientsParams::all_reduce`
    /// orders parameters by their ids instead, which are drawn at random when a model is
    /// initialised: two processes that initialised the same model from the same seed hold
    /// different ids, and would pair one parameter's gradient with another's.
    pub(crate) fn sum_gradients(
        &self,
        mut grads: GradientsParams,
        params: Vec<(ParamId, usize)>,
        step: usize,
    ) -> Result<GradientsParams, TrainError> {
        let peer = self.peer;
        self.wait(
            &format!("the gradient all-reduce of step {step}"),
            move || {
                for (id, dims) in params {
                    match dims {
                        1 => reduce_param::<B, 1>(&mut grads, id, peer)?,
                        2 => reduce_param::<B, 2>(&mut grads, id, peer)?,
                        3 => reduce_param::<B, 3>(&mut grads, id, peer)?,
                        4 => reduce_param::<B, 4>(&mut grads, id, peer)?,
                        _ => {
                            return Err(CollectiveError::Other(format!(
                                "a {dims}-dimensional parameter"
                            )))
                        }
                    }
                }
                Ok(grads)
            },
        )
    }

    /// Leaves the run (burn's `finish_collective`); every replica must.
    ///
    /// # Errors
    /// [`TrainError::Peer`] on a timeout or a collective error.
    pub fn finish(self) -> Result<(), TrainError> {
        let peer = self.peer;
        self.wait("leaving the run", move || {
            collective::finish_collective::<B>(peer)
        })
    }

    /// Runs a blocking collective call on a helper thread and waits for it up to the timeout.
    fn wait<T: Send + 'static>(
        &self,
        what: &str,
        call: impl FnOnce() -> Result<T, CollectiveError> + Send + 'static,
    ) -> Result<T, TrainError> {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            // The receiver is gone only after a timeout: nothing to tell then.
            let _ = tx.send(call());
        });
        match rx.recv_timeout(self.config.timeout) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.peer_error(what, format!("burn's collective failed: {e:?}"))),
            Err(_) => Err(self.peer_error(
                what,
                format!(
                    "no answer within {} s: a replica is missing, dead or stuck",
                    self.config.timeout.as_secs_f64()
                ),
            )),
        }
    }

    fn peer_error(&self, what: &str, problem: String) -> TrainError {
        TrainError::Peer {
            rank: self.config.rank,
            nodes: self.config.nodes,
            device: self.device_index,
            devices: self.config.devices,
            waiting_for: (0..self.replicas())
                .filter(|&r| r != self.replica())
                .collect(),
            what: what.to_string(),
            problem,
        }
    }
}

/// Replaces the gradient of parameter `id` (if it has one) by its sum over the replicas.
fn reduce_param<B: Backend, const D: usize>(
    grads: &mut GradientsParams,
    id: ParamId,
    peer: PeerId,
) -> Result<(), CollectiveError> {
    if let Some(grad) = grads.remove::<B, D>(id) {
        let summed = collective::all_reduce::<B>(
            peer,
            grad.into_primitive().tensor(),
            ReduceOperation::Sum,
        )?;
        grads.register::<B, D>(id, Tensor::from_primitive(TensorPrimitive::Float(summed)));
    }
    Ok(())
}

/// The float parameters of `module` with their number of dimensions, in visiting order.
pub(crate) fn param_order<B: Backend, M: Module<B>>(module: &M) -> Vec<(ParamId, usize)> {
    struct Order(Vec<(ParamId, usize)>);
    impl<B: Backend> ModuleVisitor<B> for Order {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push((param.id, D));
        }
    }
    let mut order = Order(Vec::new());
    module.visit(&mut order);
    order.0
}

/// A websocket address for burn's collective.
fn address(host_port: &str) -> Address {
    Address::from_str(&format!("ws://{host_port}")).expect("infallible")
}

/// Starts burn's global orchestrator on `port` on a background thread with its own runtime.
fn start_coordinator(port: u16) {
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the coordinator");
        runtime.block_on(burn_collective::start_global_orchestrator(port));
    });
}
