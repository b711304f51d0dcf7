//! A plugin's input schema: compiled once per component digest, and what a booking's
//! input is checked against (`KnownPlugins`), with the refusal's wording that the guest
//! SDKs' test kits share (`guest-sdk/testdata/input-violations.json`).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

/// A compiled input schema.
pub type InputValidator = Arc<jsonschema::Validator>;

/// Compiles an input schema given as JSON text; the error is a sentence for the uploader.
pub fn compile_input_schema(text: &str) -> Result<InputValidator, String> {
    let schema: Value =
        serde_json::from_str(text).map_err(|e| format!("its input-schema is not JSON: {e}"))?;
    jsonschema::validator_for(&schema)
        .map(Arc::new)
        .map_err(|e| format!("its input-schema is not a usable JSON Schema: {e}"))
}

/// The plugins a request names that are registered (`name` or `name@version`), each with
/// its input schema when it declares one: what booking validation checks actions
/// against.
#[derive(Clone, Default)]
pub struct KnownPlugins(pub(super) HashMap<String, Option<InputValidator>>);

/// Where an input breaks its plugin's schema: the JSON pointer into the input (empty: the
/// input itself) and what is wrong there.
#[derive(Debug, Clone, PartialEq)]
pub struct InputViolation {
    pub path: String,
    pub message: String,
}

impl KnownPlugins {
    /// Registered plugins that declare no input schema (tests and the parser fuzz).
    pub fn named<'a>(specs: impl IntoIterator<Item = &'a str>) -> Self {
        KnownPlugins(specs.into_iter().map(|s| (s.to_string(), None)).collect())
    }

    pub fn contains(&self, spec: &str) -> bool {
        self.0.contains_key(spec)
    }

    /// Checks `input` against the schema of `spec`, if it declares one; the first
    /// violation otherwise.
    pub fn check_input(&self, spec: &str, input: &Value) -> Result<(), InputViolation> {
        match self.0.get(spec) {
            Some(Some(validator)) => check_input(validator, input),
            _ => Ok(()),
        }
    }
}

/// Checks `input` against a compiled input schema: the first violation, if any.
pub fn check_input(validator: &jsonschema::Validator, input: &Value) -> Result<(), InputViolation> {
    match validator.iter_errors(input).next() {
        None => Ok(()),
        Some(e) => Err(InputViolation {
            path: e.instance_path().to_string(),
            message: crate::plugins::runtime::prefix(&e.to_string(), 300).to_string(),
        }),
    }
}

impl InputViolation {
    /// The refusal's sentence: `{what} at {path} does not fit the input schema of plugin
    /// `{plugin}`: {message}`, where `what` names the input (`birth.input`).
    pub fn sentence(&self, what: &str, plugin: &str) -> String {
        let at = if self.path.is_empty() {
            String::new()
        } else {
            format!(" at {}", self.path)
        };
        format!(
            "{what}{at} does not fit the input schema of plugin `{plugin}`: {}",
            self.message
        )
    }
}

/// Compiled input schemas by plugin digest: a component's schema never changes, so each
/// is compiled once per host. Emptied when it holds more than this many.
pub(super) const MAX_CACHED_VALIDATORS: usize = 256;

/// A registered schema, compiled. One that does not compile (checked at upload, so only a
/// hand-edited registry) checks nothing, with a warning.
pub(super) fn compiled_or_warn(digest: &str, text: &str) -> Option<InputValidator> {
    compile_input_schema(text)
        .inspect_err(
            |why| tracing::warn!(%digest, "a registered plugin's input schema is ignored: {why}"),
        )
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusals the guest SDKs' test kits must word as the host does
    /// (guest-sdk/testdata/input-violations.json, read by their tests too).
    #[test]
    fn input_violations_read_as_the_test_kits_expect() {
        let table: Value = serde_json::from_str(include_str!(
            "../../../guest-sdk/testdata/input-violations.json"
        ))
        .unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() >= 20);
        for case in cases {
            let validator = compile_input_schema(&case["schema"].to_string()).unwrap();
            let got = match check_input(&validator, &case["input"]) {
                Ok(()) => (Value::Null, Value::Null),
                Err(v) => (Value::from(v.path), Value::from(v.message)),
            };
            assert_eq!(
                got,
                (case["path"].clone(), case["message"].clone()),
                "{case}"
            );
        }
    }
}
