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
    /// GPUs whose product name contains this model as users write it:
    /// "RTX4090" matches "NVIDIA GeForce RTX 4090", "A100-80GB" matches
    /// "NVIDIA A100-SXM4-80GB", "h100" matches "NVIDIA H100 PCIe" (see
    /// [`GpuModel::matches`] for the rule).
    Named(String),
}

impl GpuModel {
    /// Whether a GPU whose NVML product name is `product_name` is this model.
    ///
    /// Both sides are cut into pieces, case-insensitively: [`words`] split
    /// on non-alphanumerics, then [`pieces`] split between letters and
    /// digits, so "RTX4090", "rtx 4090" and NVML's "RTX 4090" all read
    /// RTX, 4090. The request's pieces must then be, in the same order, the
    /// pieces of some of the product name's words, each of those words taken
    /// whole; the other words are skipped ("NVIDIA", "SXM4", "PCIe").
    /// Whole pieces keep "A10" from matching an A100 and "H100" a GH200;
    /// whole words keep a model number's glued suffix part of the model
    /// ("A10" is not an A10G, "L40" not an L40S); the order keeps
    /// "80GB A100" from matching "A100-SXM4-80GB", as before.
    pub fn matches(&self, product_name: &str) -> bool {
        match self {
            GpuModel::Any => true,
            GpuModel::Named(model) => {
                let want: Vec<String> = words(model).iter().flat_map(|w| pieces(w)).collect();
                // reach[i]: the first i wanted pieces are, in order, the
                // pieces of some whole product words seen so far. A set
                // rather than one greedy position, because taking the first
                // word that fits can strand the rest. Each word extends the
                // positions from the top down so that it is used only once.
                let mut reach = vec![false; want.len() + 1];
                reach[0] = true;
                for word in words(product_name) {
                    let word = pieces(&word);
                    for at in (0..want.len()).rev() {
                        if reach[at] && want[at..].starts_with(&word) {
                            reach[at + word.len()] = true;
                        }
                    }
                }
                reach[want.len()]
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

/// Upper-cased alphanumeric words: "NVIDIA A100-SXM4-80GB" is NVIDIA,
/// A100, SXM4, 80GB.
fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// One word (alphanumeric, as [`words`] gives it) cut between letters and
/// digits: "A100" is A, 100; "80GB" is 80, GB; "RTX4090" is RTX, 4090.
fn pieces(word: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut last_digit = None;
    for c in word.chars() {
        let digit = c.is_ascii_digit();
        match out.last_mut() {
            Some(piece) if last_digit == Some(digit) => piece.push(c),
            _ => out.push(c.to_string()),
        }
        last_digit = Some(digit);
    }
    out
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

    /// Product names as NVML reports them.
    const NVML_NAMES: &[&str] = &[
        "NVIDIA GeForce RTX 4090",
        "NVIDIA GeForce RTX 4080 SUPER",
        "NVIDIA GeForce RTX 3090",
        "NVIDIA RTX A6000",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H200",
        "NVIDIA GH200 480GB",
        "NVIDIA A10G",
        "NVIDIA A10",
        "NVIDIA L4",
        "NVIDIA L40",
        "NVIDIA L40S",
        "Tesla T4",
        "Tesla V100-SXM2-16GB",
    ];

    #[test]
    fn models_as_users_write_them_match_nvml_product_names() {
        // Each request and exactly the product names it must match; every
        // other name in NVML_NAMES must not match.
        let table: &[(&str, &[&str])] = &[
            ("RTX4090", &["NVIDIA GeForce RTX 4090"]),
            ("RTX 4090", &["NVIDIA GeForce RTX 4090"]),
            ("rtx4090", &["NVIDIA GeForce RTX 4090"]),
            ("4090", &["NVIDIA GeForce RTX 4090"]),
            ("GeForce RTX 3090", &["NVIDIA GeForce RTX 3090"]),
            ("RTX 4080", &["NVIDIA GeForce RTX 4080 SUPER"]),
            (
                "RTX",
                &[
                    "NVIDIA GeForce RTX 4090",
                    "NVIDIA GeForce RTX 4080 SUPER",
                    "NVIDIA GeForce RTX 3090",
                    "NVIDIA RTX A6000",
                ],
            ),
            ("A6000", &["NVIDIA RTX A6000"]),
            (
                "A100",
                &[
                    "NVIDIA A100-SXM4-80GB",
                    "NVIDIA A100-PCIE-40GB",
                    "NVIDIA A100 80GB PCIe",
                ],
            ),
            (
                "A100-80GB",
                &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
            ),
            (
                "A100 80GB",
                &["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
            ),
            ("A100-40GB", &["NVIDIA A100-PCIE-40GB"]),
            ("A100 40GB", &["NVIDIA A100-PCIE-40GB"]),
            ("A100 SXM4", &["NVIDIA A100-SXM4-80GB"]),
            ("nvidia a100-pcie-40gb", &["NVIDIA A100-PCIE-40GB"]),
            ("80GB A100", &[]),
            (
                "H100",
                &[
                    "NVIDIA H100 80GB HBM3",
                    "NVIDIA H100 PCIe",
                    "NVIDIA H100 NVL",
                ],
            ),
            (
                "h100",
                &[
                    "NVIDIA H100 80GB HBM3",
                    "NVIDIA H100 PCIe",
                    "NVIDIA H100 NVL",
                ],
            ),
            (
                "H 100",
                &[
                    "NVIDIA H100 80GB HBM3",
                    "NVIDIA H100 PCIe",
                    "NVIDIA H100 NVL",
                ],
            ),
            ("H100 PCIe", &["NVIDIA H100 PCIe"]),
            ("H200", &["NVIDIA H200"]),
            ("GH200", &["NVIDIA GH200 480GB"]),
            ("A10", &["NVIDIA A10"]),
            ("A10G", &["NVIDIA A10G"]),
            ("L4", &["NVIDIA L4"]),
            ("L40", &["NVIDIA L40"]),
            ("L40S", &["NVIDIA L40S"]),
            ("T4", &["Tesla T4"]),
            ("V100", &["Tesla V100-SXM2-16GB"]),
            ("100", &[]),
            ("any", NVML_NAMES),
        ];
        for (request, expected) in table {
            let model = GpuRequest::from_create(None, Some(request), None)
                .expect("valid request")
                .expect("asks for a GPU")
                .model;
            for name in NVML_NAMES {
                assert_eq!(
                    model.matches(name),
                    expected.contains(name),
                    "{request:?} against {name:?}"
                );
            }
        }
    }

    #[test]
    fn words_are_cut_between_letters_and_digits() {
        let all = |s: &str| -> Vec<String> { words(s).iter().flat_map(|w| pieces(w)).collect() };
        assert_eq!(all("RTX4090"), ["RTX", "4090"]);
        assert_eq!(all("A100-80GB"), ["A", "100", "80", "GB"]);
        assert_eq!(
            all("NVIDIA A100-SXM4-80GB"),
            ["NVIDIA", "A", "100", "SXM", "4", "80", "GB"]
        );
        assert_eq!(all("l40s"), ["L", "40", "S"]);
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
