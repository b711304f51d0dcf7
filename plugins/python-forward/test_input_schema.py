"""The test kit checks an input against the plugin's declared input schema as kairos
does at booking, in the host's words: every case of guest-sdk/testdata/input-violations.json
(which the host's own unit test reads too) gives the host's path and message, and an
input that does not fit never reaches run."""

import json
import pathlib
import unittest

from kairos_guest import export_action, testing

import app

CASES = json.loads(
    (pathlib.Path(__file__).parent / "../../guest-sdk/testdata/input-violations.json").read_text()
)["cases"]


class InputSchemaTest(unittest.TestCase):
    def test_every_case_is_refused_or_taken_as_the_host_does(self):
        for case in CASES:
            ran = []

            def run(ctx, input):
                ran.append(input)
                return "ran"

            export_action(run, input_schema=case["schema"])
            with self.subTest(schema=case["schema"], input=case["input"]):
                with testing.Kit() as kit:
                    if case["message"] is None:
                        self.assertEqual(kit.call(run, case["input"]), "ran")
                        self.assertEqual(ran, [case["input"]])
                        continue
                    with self.assertRaises(testing.InvalidInput) as refused:
                        kit.call(run, case["input"])
                at = f" at {case['path']}" if case["path"] else ""
                self.assertEqual(
                    refused.exception.message,
                    f"birth.input{at} does not fit the input schema of plugin "
                    f"`test-plugin`: {case['message']}",
                )
                self.assertEqual(refused.exception.path, case["path"])
                self.assertFalse(refused.exception.retryable)
                self.assertEqual(ran, [], "an input that does not fit reached run")

    def test_python_forward_refuses_a_url_that_is_not_a_string_before_it_runs(self):
        with testing.Kit().on_http(lambda r: testing.response(200)) as kit:
            with self.assertRaises(testing.InvalidInput) as refused:
                kit.call(app.run, {"url": 5}, testing.context(plugin_name="python-forward"))
        # The words of `kairos plugins run` and of a booking's 400 invalid_input.
        self.assertEqual(
            refused.exception.message,
            "birth.input at /url does not fit the input schema of plugin `python-forward`: "
            '5 is not of type "string"',
        )
        self.assertEqual(kit.requests, [])

    def test_a_run_without_a_declared_schema_takes_any_input(self):
        def run(ctx, input):
            return input

        export_action(run)
        with testing.Kit() as kit:
            self.assertEqual(kit.call(run, {"counter": "x"}), {"counter": "x"})


if __name__ == "__main__":
    unittest.main()
