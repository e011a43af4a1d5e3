//! A file of hashed API keys for tests of consumers and plans.

use std::path::PathBuf;

use sluice::caller::api_keys::KeyHash;

/// A file of hashed keys: `(key, consumer, plan, disabled)`.
pub struct KeyFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl KeyFile {
    /// The `identity` section of plans free and pro (free the default) with this key file.
    pub fn free_and_pro(&self) -> String {
        format!(
            "{{ plans: [free, pro], default_plan: free, api_keys: {{ file: {} }} }}",
            self.path.display()
        )
    }

    pub fn write(keys: &[(&str, &str, Option<&str>, bool)]) -> KeyFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("api-keys.yaml");
        let file = KeyFile { _dir: dir, path };
        file.rewrite(keys);
        file
    }

    pub fn rewrite(&self, keys: &[(&str, &str, Option<&str>, bool)]) {
        let mut text = String::from("keys:\n");
        for (key, consumer, plan, disabled) in keys {
            text.push_str(&format!(
                "  - {{ hash: \"{}\", consumer: {consumer}",
                KeyHash::of(key.as_bytes())
            ));
            if let Some(plan) = plan {
                text.push_str(&format!(", plan: {plan}"));
            }
            if *disabled {
                text.push_str(", disabled: true");
            }
            text.push_str(" }\n");
        }
        std::fs::write(&self.path, text).expect("write the key file");
    }
}
