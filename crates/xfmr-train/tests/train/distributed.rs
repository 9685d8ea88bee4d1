//! Data-parallel membership on burn's collective: configuration errors name the option, and two
//! replicas in one process (threads sharing ndarray's device) sum their values and notice when
//! they disagree. Whole training runs across processes and devices are tested through the
//! binary (`crates/xfmr-cli/tests/cli/parallel.rs`).

use std::thread;
use std::time::Duration;

use burn::backend::NdArray;
use xfmr_train::{DataParallel, DataParallelConfig, TrainError};

type B = NdArray<f32>;

/// A run of `nodes` processes of `devices` replicas, this one rank 0, on loopback.
fn config(nodes: u32, devices: u32) -> DataParallelConfig {
    DataParallelConfig::new(nodes, 0, "127.0.0.1:1", "127.0.0.1", 2)
        .with_devices(devices)
        .with_timeout(Duration::from_secs(60))
}

#[test]
fn invalid_configurations_name_the_option() {
    let device = Default::default();
    let cases = [
        (config(0, 1), 0, "nodes"),
        (config(2, 1).with_rank(2), 0, "rank"),
        (config(1, 0), 0, "devices"),
        (config(1, 2), 2, "device"),
        (config(1, 1).with_timeout(Duration::ZERO), 0, "timeout"),
        (
            DataParallelConfig::new(2, 0, "localhost", "127.0.0.1", 2),
            0,
            "coordinator",
        ),
    ];
    for (config, device_index, expected) in cases {
        match DataParallel::<B>::join(config.clone(), device_index, &device) {
            Err(TrainError::InvalidConfig { field, .. }) => {
                assert_eq!(field, expected, "{config:?}")
            }
            other => panic!("{config:?}, device {device_index}: {other:?}"),
        }
    }
}

/// Two replicas on two threads: `sum` adds their values, `agree` passes when they hold the same
/// value and fails on both, naming the operation, the replica and the one it waited for, when
/// they do not.
#[test]
fn two_replicas_sum_and_notice_disagreement() {
    // burn's collective is one per process: no other test's replicas may register meanwhile.
    let _guard = crate::trainer::lock();
    let replicas: Vec<_> = (0..2u32)
        .map(|d| {
            thread::spawn(move || {
                let run = DataParallel::<B>::join(config(1, 2), d, &Default::default()).unwrap();
                assert_eq!((run.replica(), run.replicas()), (d, 2));
                let expected: &[usize] = [&[10, 12, 14][..], &[11, 13]][d as usize];
                assert_eq!(run.share(&[10, 11, 12, 13, 14]), expected);
                let sum = run.sum(&[1.0 + f64::from(d), 10.0], "a test sum").unwrap();
                let same = run.agree(0x1234_5678_9abc_def0, "a value both hold");
                let differ = run.agree(u64::from(d), "a value that differs");
                run.finish().unwrap();
                (sum, same, differ)
            })
        })
        .collect();
    for (d, replica) in replicas.into_iter().enumerate() {
        let (sum, same, differ) = replica.join().unwrap();
        assert_eq!(sum, [3.0, 20.0], "replica {d}");
        assert!(same.is_ok(), "replica {d}: {same:?}");
        match differ {
            Err(TrainError::Peer {
                device,
                waiting_for,
                what,
                problem,
                ..
            }) => {
                assert_eq!(device, d as u32);
                assert_eq!(waiting_for, [1 - d as u32]);
                assert_eq!(what, "a value that differs");
                assert!(problem.contains(&format!("this one has {d}")), "{problem}");
            }
            other => panic!("replica {d}: {other:?}"),
        }
    }
}
