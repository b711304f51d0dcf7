//! A plugin for version 0.1.0 of the kairos:plugin world: it has `run` and no
//! `input-schema` export. It answers `{"v01": INPUT}`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "kairos:plugin/action@0.1.0",
    generate_all,
});

struct Legacy;

impl Guest for Legacy {
    fn run(_ctx: Context, input: String) -> Result<String, PluginError> {
        Ok(format!("{{\"v01\":{input}}}"))
    }
}

export!(Legacy);
