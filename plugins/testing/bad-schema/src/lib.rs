//! A plugin whose declared input schema is not JSON Schema (`"type": 12`): the tests
//! check that kairos refuses its upload.

use kairos_guest::{export_action, Context, Error};

fn run(_ctx: Context, _input: serde_json::Value) -> Result<(), Error> {
    Ok(())
}

export_action!(run, input_schema = r#"{"type": 12}"#);
