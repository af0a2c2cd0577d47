//! The catalog of model cards and hardware profiles: the files under `profiles/` embedded at
//! build time, plus any directory a user points at (a dropped-in YAML file adds or overrides a
//! profile of the same name).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::PlanError;
use crate::hardware::HardwareProfile;
use crate::model::ModelCard;
use crate::parse::{from_value_at, parse_yaml_value};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_profiles.rs"));
}

/// Model cards and hardware profiles by name.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    models: BTreeMap<String, ModelCard>,
    hardware: BTreeMap<String, HardwareProfile>,
}

fn parse_model(name: &str, text: &str, source: &str) -> Result<ModelCard, PlanError> {
    let value = parse_yaml_value(text, source)?;
    let mut card: ModelCard = from_value_at(value, source)?;
    if card.name.is_empty() {
        card.name = name.to_string();
    }
    card.validate(source)?;
    Ok(card)
}

fn parse_hardware(name: &str, text: &str, source: &str) -> Result<HardwareProfile, PlanError> {
    let value = parse_yaml_value(text, source)?;
    let mut profile: HardwareProfile = from_value_at(value, source)?;
    if profile.name.is_empty() {
        profile.name = name.to_string();
    }
    profile.validate(source)?;
    Ok(profile)
}

impl Catalog {
    /// The profiles shipped in the repository (embedded at build time).
    pub fn builtin() -> Result<Catalog, PlanError> {
        let mut c = Catalog::default();
        for (name, text) in embedded::MODELS {
            let card = parse_model(name, text, &format!("profiles/models/{name}.yaml"))?;
            c.models.insert(name.to_string(), card);
        }
        for (name, text) in embedded::HARDWARE {
            let p = parse_hardware(name, text, &format!("profiles/hardware/{name}.yaml"))?;
            c.hardware.insert(name.to_string(), p);
        }
        Ok(c)
    }

    /// Add (or override) profiles from `dir/models/*.yaml` and `dir/hardware/*.yaml`.
    pub fn load_dir(&mut self, dir: &Path) -> Result<(), PlanError> {
        if !dir.is_dir() {
            return Err(PlanError::Io {
                path: dir.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            });
        }
        for kind in ["models", "hardware"] {
            let sub = dir.join(kind);
            let Ok(entries) = std::fs::read_dir(&sub) else {
                continue;
            };
            // Listed to at most the bound plus one entry: a directory of millions of files is
            // refused, not collected.
            let max = crate::bounds::limits::PROFILE_FILES;
            let listed: Vec<_> = entries.take(max as usize + 1).flatten().collect();
            if listed.len() as u64 > max {
                return Err(PlanError::Io {
                    path: sub.display().to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("more than {max} entries, more than any profiles directory"),
                    ),
                });
            }
            let mut paths: Vec<_> = listed
                .into_iter()
                .map(|e| e.path())
                .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("yaml"))
                .collect();
            paths.sort();
            for path in paths {
                let name = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_string();
                let text = crate::bounds::read_input(&path, crate::bounds::limits::DOCUMENT_BYTES)?;
                let source = path.display().to_string();
                if kind == "models" {
                    let card = parse_model(&name, &text, &source)?;
                    self.models.insert(name, card);
                } else {
                    let p = parse_hardware(&name, &text, &source)?;
                    self.hardware.insert(name, p);
                }
            }
        }
        Ok(())
    }

    pub fn model(&self, name: &str) -> Option<&ModelCard> {
        self.models.get(name)
    }

    pub fn hardware(&self, name: &str) -> Option<&HardwareProfile> {
        self.hardware.get(name)
    }

    pub fn model_names(&self) -> Vec<&str> {
        self.models.keys().map(String::as_str).collect()
    }

    pub fn hardware_names(&self) -> Vec<&str> {
        self.hardware.keys().map(String::as_str).collect()
    }

    pub fn models(&self) -> impl Iterator<Item = &ModelCard> {
        self.models.values()
    }

    pub fn hardware_profiles(&self) -> impl Iterator<Item = &HardwareProfile> {
        self.hardware.values()
    }

    /// Find the hardware profile whose Kubernetes product label value matches `product`
    /// (as a node selector spells it), case-insensitively.
    pub fn hardware_by_product_label(&self, product: &str) -> Option<&HardwareProfile> {
        self.hardware.values().find(|p| {
            p.kubernetes
                .product_values
                .iter()
                .any(|v| v.eq_ignore_ascii_case(product))
        })
    }
}
