//! What a create request asks for in GPUs (`gpu`, `gpu_count`), validated,
//! and how a model name matches a GPU's product name.

use super::error::RequestError;

/// Most GPUs one sandbox may ask for (more than any one host has).
pub const MAX_GPU_COUNT: u32 = 64;

/// Longest accepted model name.
const MAX_MODEL_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuModel {
    /// Any GPU of this host.
    Any,
    /// GPUs whose product name contains these words in this order, e.g.
    /// "H200" matches "NVIDIA H200" and "A100 80GB" matches "NVIDIA A100-SXM4-80GB".
    Named(String),
}

impl GpuModel {
    pub fn matches(&self, product_name: &str) -> bool {
        match self {
            GpuModel::Any => true,
            GpuModel::Named(model) => {
                let name = words(product_name);
                let mut name = name.iter();
                words(model).iter().all(|w| name.any(|n| n == w))
            }
        }
    }
}

impl std::fmt::Display for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuModel::Any => f.write_str("any"),
            GpuModel::Named(m) => f.write_str(m),
        }
    }
}

/// Upper-cased alphanumeric words.
fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// Whole GPUs, exclusively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequest {
    pub model: GpuModel,
    pub count: u32,
}

impl GpuRequest {
    /// The GPU part of a create request: `None` when it asks for none.
    /// `gpu_count` alone means that many GPUs of any model; `gpu` alone
    /// means one; `gpu_count: 0` without `gpu` means none.
    pub fn from_create(
        runtime: Option<crate::model::RuntimeKind>,
        gpu: Option<&str>,
        gpu_count: Option<u32>,
    ) -> Result<Option<Self>, RequestError> {
        let count = match (gpu, gpu_count) {
            (None, None) | (None, Some(0)) => return Ok(None),
            (_, Some(n)) => n,
            (Some(_), None) => 1,
        };
        if runtime == Some(crate::model::RuntimeKind::Vm) {
            return Err(RequestError::VmRuntime);
        }
        if count == 0 || count > MAX_GPU_COUNT {
            return Err(RequestError::BadCount {
                got: count,
                max: MAX_GPU_COUNT,
            });
        }
        let model = match gpu {
            None => GpuModel::Any,
            Some(m) if m.eq_ignore_ascii_case("any") => GpuModel::Any,
            Some(m) => {
                let printable = m.chars().all(|c| c.is_ascii_graphic() || c == ' ');
                if m.len() > MAX_MODEL_LEN || !printable || words(m).is_empty() {
                    return Err(RequestError::BadModel(m.to_string()));
                }
                GpuModel::Named(m.to_string())
            }
        };
        Ok(Some(Self { model, count }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_match_product_names_by_words() {
        let h200 = GpuModel::Named("H200".into());
        assert!(h200.matches("NVIDIA H200"));
        assert!(GpuModel::Named("h200".into()).matches("NVIDIA H200"));
        assert!(!h200.matches("NVIDIA H100 80GB HBM3"));
        assert!(!GpuModel::Named("H20".into()).matches("NVIDIA H200"));
        let a100 = GpuModel::Named("A100 80GB".into());
        assert!(a100.matches("NVIDIA A100-SXM4-80GB"));
        assert!(!a100.matches("NVIDIA A100-SXM4-40GB"));
        assert!(!GpuModel::Named("80GB A100".into()).matches("NVIDIA A100-SXM4-80GB"));
        assert!(GpuModel::Any.matches("anything"));
    }

    #[test]
    fn create_fields_become_a_request_or_a_reason() {
        let r = |gpu, count| GpuRequest::from_create(None, gpu, count);
        assert_eq!(r(None, None).expect("ok"), None);
        assert_eq!(r(None, Some(0)).expect("ok"), None);
        assert_eq!(
            r(Some("H200"), None).expect("ok"),
            Some(GpuRequest {
                model: GpuModel::Named("H200".into()),
                count: 1
            })
        );
        assert_eq!(
            r(None, Some(2)).expect("ok"),
            Some(GpuRequest {
                model: GpuModel::Any,
                count: 2
            })
        );
        assert_eq!(
            r(Some("ANY"), Some(3)).expect("ok").map(|q| q.model),
            Some(GpuModel::Any)
        );
        assert!(matches!(
            r(Some("H200"), Some(0)),
            Err(RequestError::BadCount { .. })
        ));
        assert!(matches!(
            r(Some("H200"), Some(MAX_GPU_COUNT + 1)),
            Err(RequestError::BadCount { .. })
        ));
        for bad in ["", "--", "H200\n", &"x".repeat(65)] {
            assert!(
                matches!(r(Some(bad), None), Err(RequestError::BadModel(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            GpuRequest::from_create(Some(crate::model::RuntimeKind::Vm), Some("any"), None),
            Err(RequestError::VmRuntime)
        ));
        assert_eq!(
            GpuRequest::from_create(Some(crate::model::RuntimeKind::Vm), None, None).expect("ok"),
            None
        );
    }
}
