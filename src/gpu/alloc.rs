//! Exclusive whole-GPU allocation: which sandbox holds which GPU. Pure
//! logic under one lock, so concurrent creates can never share a GPU. The
//! holders are also stored in each sandbox's record, and [`GpuAllocator::rebuild`]
//! restores them from there after a restart.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::discovery::GpuInfo;
use super::error::AllocError;
use super::request::GpuRequest;

/// A GPU and the sandbox holding it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub gpu: GpuInfo,
    pub held_by: Option<String>,
}

#[derive(Default)]
struct State {
    gpus: Vec<GpuInfo>,
    /// GPU UUID → sandbox id. May name GPUs missing from the last discovery:
    /// one that comes back is still held.
    holders: BTreeMap<String, String>,
}

pub struct GpuAllocator {
    state: Mutex<State>,
}

impl GpuAllocator {
    pub fn new(gpus: Vec<GpuInfo>) -> Self {
        Self {
            state: Mutex::new(State {
                gpus,
                holders: BTreeMap::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the inventory (a new discovery); holders are kept.
    pub fn set_inventory(&self, mut gpus: Vec<GpuInfo>) {
        gpus.sort_by_key(|g| g.index);
        self.state().gpus = gpus;
    }

    pub fn inventory(&self) -> Vec<Holding> {
        let state = self.state();
        state
            .gpus
            .iter()
            .map(|gpu| Holding {
                gpu: gpu.clone(),
                held_by: state.holders.get(&gpu.uuid).cloned(),
            })
            .collect()
    }

    /// Gives `sandbox` `request.count` free GPUs matching the model (lowest
    /// index first), or says why not: 400-kinds when this host can never
    /// meet the request, [`AllocError::Busy`] when it cannot now.
    pub fn allocate(
        &self,
        sandbox: &str,
        request: &GpuRequest,
    ) -> Result<Vec<GpuInfo>, AllocError> {
        let mut state = self.state();
        if state.holders.values().any(|h| h == sandbox) {
            return Err(AllocError::AlreadyHolds(sandbox.to_string()));
        }
        let matching: Vec<&GpuInfo> = state
            .gpus
            .iter()
            .filter(|g| request.model.matches(&g.name))
            .collect();
        let model = request.model.to_string();
        if matching.is_empty() {
            return Err(AllocError::NoSuchModel {
                model,
                available: describe(&state.gpus),
            });
        }
        let present = matching.len() as u32;
        if request.count > present {
            return Err(AllocError::TooMany {
                model,
                requested: request.count,
                present,
            });
        }
        let free: Vec<GpuInfo> = matching
            .into_iter()
            .filter(|g| !state.holders.contains_key(&g.uuid))
            .cloned()
            .collect();
        if (free.len() as u32) < request.count {
            return Err(AllocError::Busy {
                model,
                requested: request.count,
                free: free.len() as u32,
                present,
            });
        }
        let chosen: Vec<GpuInfo> = free.into_iter().take(request.count as usize).collect();
        for gpu in &chosen {
            state.holders.insert(gpu.uuid.clone(), sandbox.to_string());
        }
        Ok(chosen)
    }

    /// Frees every GPU `sandbox` holds; returns their UUIDs.
    pub fn release(&self, sandbox: &str) -> Vec<String> {
        let mut state = self.state();
        let freed: Vec<String> = state
            .holders
            .iter()
            .filter(|(_, h)| *h == sandbox)
            .map(|(uuid, _)| uuid.clone())
            .collect();
        for uuid in &freed {
            state.holders.remove(uuid);
        }
        freed
    }

    /// UUIDs `sandbox` holds.
    pub fn held_by(&self, sandbox: &str) -> Vec<String> {
        self.state()
            .holders
            .iter()
            .filter(|(_, h)| *h == sandbox)
            .map(|(uuid, _)| uuid.clone())
            .collect()
    }

    /// Sets the holders to exactly those of `records` (sandbox id, UUIDs),
    /// as stored before a restart. A GPU claimed by two records stays with
    /// the first; the conflicts are returned for the log.
    pub fn rebuild<I>(&self, records: I) -> Vec<String>
    where
        I: IntoIterator<Item = (String, Vec<String>)>,
    {
        let mut problems = Vec::new();
        let mut holders = BTreeMap::new();
        for (sandbox, uuids) in records {
            for uuid in uuids {
                match holders.get(&uuid) {
                    Some(first) if first != &sandbox => problems.push(format!(
                        "GPU {uuid} is recorded for both {first} and {sandbox}; it stays with {first}"
                    )),
                    _ => {
                        holders.insert(uuid, sandbox.clone());
                    }
                }
            }
        }
        let mut state = self.state();
        for uuid in holders.keys() {
            if !state.gpus.iter().any(|g| &g.uuid == uuid) {
                problems.push(format!(
                    "GPU {uuid} is recorded as held but was not discovered; it stays held"
                ));
            }
        }
        state.holders = holders;
        problems
    }
}

/// "2 × NVIDIA H200, 1 × NVIDIA A100-SXM4-80GB", or "no GPUs".
fn describe(gpus: &[GpuInfo]) -> String {
    if gpus.is_empty() {
        return "no GPUs".into();
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for gpu in gpus {
        match counts.iter_mut().find(|(n, _)| *n == gpu.name) {
            Some((_, c)) => *c += 1,
            None => counts.push((&gpu.name, 1)),
        }
    }
    counts
        .iter()
        .map(|(name, n)| format!("{n} × {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gpu::request::GpuModel;

    fn gpu(index: u32, name: &str) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: name.into(),
            memory_mib: 1024,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
            minor_number: index,
        }
    }

    fn req(model: &str, count: u32) -> GpuRequest {
        GpuRequest {
            model: if model == "any" {
                GpuModel::Any
            } else {
                GpuModel::Named(model.into())
            },
            count,
        }
    }

    fn host() -> GpuAllocator {
        GpuAllocator::new(vec![
            gpu(0, "NVIDIA H200"),
            gpu(1, "NVIDIA H200"),
            gpu(2, "NVIDIA A100-SXM4-80GB"),
        ])
    }

    #[test]
    fn allocation_is_exclusive_and_lowest_index_first() {
        let a = host();
        let got = a.allocate("sb-1", &req("H200", 1)).expect("free");
        assert_eq!(got[0].uuid, "GPU-0");
        let got = a.allocate("sb-2", &req("H200", 1)).expect("free");
        assert_eq!(got[0].uuid, "GPU-1");
        match a.allocate("sb-3", &req("H200", 1)) {
            Err(AllocError::Busy {
                free: 0,
                present: 2,
                requested: 1,
                ..
            }) => {}
            other => panic!("expected busy, got {other:?}"),
        }
        // The A100 is still free for "any".
        let got = a.allocate("sb-3", &req("any", 1)).expect("a100 free");
        assert_eq!(got[0].uuid, "GPU-2");
        assert!(matches!(
            a.allocate("sb-3", &req("any", 1)),
            Err(AllocError::AlreadyHolds(_))
        ));
        let held: Vec<_> = a.inventory().into_iter().map(|h| h.held_by).collect();
        assert_eq!(
            held,
            vec![
                Some("sb-1".into()),
                Some("sb-2".into()),
                Some("sb-3".into())
            ]
        );
    }

    #[test]
    fn impossible_requests_are_not_busy() {
        let a = host();
        match a.allocate("sb", &req("B200", 1)) {
            Err(AllocError::NoSuchModel { available, .. }) => {
                assert_eq!(available, "2 × NVIDIA H200, 1 × NVIDIA A100-SXM4-80GB")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.allocate("sb", &req("H200", 3)),
            Err(AllocError::TooMany { present: 2, .. })
        ));
        let none = GpuAllocator::new(Vec::new());
        match none.allocate("sb", &req("any", 1)) {
            Err(AllocError::NoSuchModel { available, .. }) => assert_eq!(available, "no GPUs"),
            other => panic!("{other:?}"),
        }
        assert!(a.inventory().iter().all(|h| h.held_by.is_none()));
    }

    #[test]
    fn a_multi_gpu_request_takes_all_or_nothing() {
        let a = host();
        a.allocate("sb-1", &req("H200", 1)).expect("free");
        assert!(matches!(
            a.allocate("sb-2", &req("H200", 2)),
            Err(AllocError::Busy { free: 1, .. })
        ));
        assert!(a.held_by("sb-2").is_empty(), "nothing taken on failure");
        a.release("sb-1");
        let got = a.allocate("sb-2", &req("H200", 2)).expect("both free");
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn release_frees_only_that_sandbox() {
        let a = host();
        a.allocate("sb-1", &req("H200", 2)).expect("free");
        a.allocate("sb-2", &req("A100", 1)).expect("free");
        let mut freed = a.release("sb-1");
        freed.sort();
        assert_eq!(freed, vec!["GPU-0".to_string(), "GPU-1".to_string()]);
        assert!(a.release("sb-1").is_empty(), "idempotent");
        assert_eq!(a.held_by("sb-2"), vec!["GPU-2".to_string()]);
        a.allocate("sb-3", &req("H200", 2))
            .expect("freed GPUs reusable");
    }

    #[test]
    fn exclusive_under_concurrency() {
        let a = Arc::new(host());
        let threads: Vec<_> = (0..32)
            .map(|i| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || a.allocate(&format!("sb-{i}"), &req("any", 1)).ok())
            })
            .collect();
        let winners: Vec<Vec<GpuInfo>> = threads
            .into_iter()
            .filter_map(|t| t.join().expect("thread"))
            .collect();
        assert_eq!(winners.len(), 3, "exactly one winner per GPU");
        let mut uuids: Vec<String> = winners.iter().map(|w| w[0].uuid.clone()).collect();
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), 3, "no GPU given twice");
    }

    #[test]
    fn rebuild_restores_holders_from_records() {
        let a = host();
        a.allocate("stale", &req("any", 1)).expect("free");
        let problems = a.rebuild(vec![
            ("sb-1".to_string(), vec!["GPU-1".to_string()]),
            (
                "sb-2".to_string(),
                vec!["GPU-1".to_string(), "GPU-2".to_string()],
            ),
            ("sb-3".to_string(), vec!["GPU-9".to_string()]),
            ("sb-4".to_string(), Vec::new()),
        ]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("GPU-1") && problems[0].contains("sb-1"));
        assert!(problems[1].contains("GPU-9"));
        assert!(a.held_by("stale").is_empty(), "rebuild replaces holders");
        assert_eq!(a.held_by("sb-1"), vec!["GPU-1".to_string()]);
        assert_eq!(a.held_by("sb-2"), vec!["GPU-2".to_string()]);
        // GPU-0 is the only free one now.
        let got = a.allocate("sb-5", &req("any", 1)).expect("one free");
        assert_eq!(got[0].uuid, "GPU-0");
        assert!(matches!(
            a.allocate("sb-6", &req("any", 1)),
            Err(AllocError::Busy { .. })
        ));
    }

    #[test]
    fn a_new_inventory_keeps_holders() {
        let a = host();
        a.allocate("sb-1", &req("H200", 1)).expect("free");
        a.set_inventory(vec![gpu(1, "NVIDIA H200")]);
        assert_eq!(a.inventory().len(), 1);
        a.set_inventory(vec![gpu(0, "NVIDIA H200"), gpu(1, "NVIDIA H200")]);
        assert_eq!(a.inventory()[0].held_by.as_deref(), Some("sb-1"));
    }
}
