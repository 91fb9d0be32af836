//! `DEVGATE_BENCH_STANDING=N`: N pods that hold devices for the whole run,
//! as a node's other GPU pods do, so that each creation meets a ledger of
//! N more pods (their claims, records and containers) than its own.

use crate::support::node::{allocation, gpu_share_entry, vf_entry, Node, DEVICE_ALLOCATED};
use crate::support::{ContainerSpec, Cri, Pod, PodSpec};

/// The GPUs the benchmark's pod leaves free (it takes the first four).
const FREE_GPUS: std::ops::Range<usize> = 4..8;

/// The standing pods, each with one container created (never started): the
/// network owner of a pod that has a VF.
pub struct Standing {
    pods: Vec<Pod>,
}

impl Standing {
    /// `n` pods sharing the four free GPUs in equal shares, one GPU each
    /// (up to four pods: a whole GPU each); the first twelve also take a VF
    /// (the second to fourth of each of the four PFs whose first VF is the
    /// benchmark's pod's).
    pub fn run(node: &Node, cri: &Cri, n: usize) -> Standing {
        // A share is at least 1 %: 100 pods on each GPU at most.
        assert!(
            n <= 100 * FREE_GPUS.len(),
            "DEVGATE_BENCH_STANDING: at most {} pods",
            100 * FREE_GPUS.len()
        );
        let inv = node.fixture.expected();
        let per_gpu = n.div_ceil(FREE_GPUS.len()).max(1);
        let percent = (100 / per_gpu) as u32;
        let pods = (0..n)
            .map(|k| {
                let gpu = &inv.gpus[FREE_GPUS.start + k % FREE_GPUS.len()];
                let gpus = [gpu_share_entry(gpu.minor, &gpu.uuid, percent)];
                // An RDMA entry's minor is its NIC's.
                let (minor, vf) = (k % 4, 1 + k / 4);
                let nic = &inv.rdma[minor];
                let rdma: Vec<String> = nic
                    .vfs
                    .get(vf)
                    .map(|v| vf_entry(minor, nic.bus_id, v.bus_id))
                    .into_iter()
                    .collect();
                let spec = PodSpec::new(&format!("standing{k}"))
                    .annotation(DEVICE_ALLOCATED, &allocation(&gpus, &rdma));
                let pod = cri.run_pod(&spec).expect("a standing pod's RunPodSandbox");
                cri.create_container(&pod, &ContainerSpec::shell("main", "true"))
                    .expect("a standing pod's CreateContainer");
                pod
            })
            .collect();
        Standing { pods }
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Stops and removes the pods (their containers with them).
    pub fn remove(self, cri: &Cri) {
        for pod in &self.pods {
            crate::pods::remove(cri, pod);
        }
    }
}
