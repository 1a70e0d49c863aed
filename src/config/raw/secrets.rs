//! Secret values in the file (registrar salts): kept out of `Debug`.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Secret values by name: `Debug` shows the names only.
#[derive(Default, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}
