"""python-forward's run(), natively, with the test kit: python3 -m unittest (from this
directory, with guest-sdk/python on PYTHONPATH)."""

import json
import unittest

from kairos_guest import PlanKind, testing
from kairos_guest.http import HttpError

import app

INPUT = {"url": "https://hooks.example.com/x", "headers": {"x-team": "ops"}, "body": {"n": 1}}


class ForwardTest(unittest.TestCase):
    def test_forwards_the_body_and_reports_the_status(self):
        with testing.Kit().on_http(lambda r: testing.response(202)) as kit:
            out = kit.call(app.run, INPUT)
        self.assertEqual(out, {"status": 202})
        sent = kit.requests[0]
        self.assertEqual((sent.method, sent.url), ("POST", "https://hooks.example.com/x"))
        self.assertEqual(sent.json(), {"n": 1})
        self.assertEqual(sent.header("x-team"), "ops")
        self.assertEqual(sent.header("x-kairos-life"), "test-life")
        self.assertEqual(sent.header("content-length"), "7")
        self.assertEqual(kit.logs, ["info: POST https://hooks.example.com/x -> 202"])

    def test_the_input_schema_is_the_dataclass(self):
        schema = json.loads(app.WitWorld().input_schema())
        self.assertEqual(schema["required"], ["url"])
        self.assertEqual(schema["properties"]["url"], {"type": "string"})
        self.assertEqual(
            schema["properties"]["headers"],
            {"type": "object", "additionalProperties": {"type": "string"}},
        )
        self.assertEqual(schema["properties"]["body"], {})
        self.assertFalse(schema["additionalProperties"])

    def test_a_5xx_or_no_answer_is_retried_and_a_4xx_is_not(self):
        with testing.Kit().on_http(lambda r: testing.response(503)) as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, INPUT)
        self.assertTrue(failed.exception.retryable)
        with testing.Kit().on_http(lambda r: testing.response(404)) as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, INPUT)
        self.assertFalse(failed.exception.retryable)
        self.assertIn("404", failed.exception.message)

        def unreachable(request):
            raise HttpError("connection refused")

        with testing.Kit().on_http(unreachable) as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, INPUT)
        self.assertTrue(failed.exception.retryable)

    def test_a_url_that_is_not_http_fails_for_good_and_sends_nothing(self):
        with testing.Kit().on_http(lambda r: testing.response(200)) as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, {"url": "ftp://files.example/x"})
        self.assertEqual(
            failed.exception.message,
            "ftp://files.example/x: only absolute http:// and https:// URLs are supported",
        )
        self.assertFalse(failed.exception.retryable)
        self.assertEqual(kit.requests, [])

    def test_a_refused_request_fails_for_good(self):
        def refuse(request):
            raise HttpError(f"{request.url}: the request was denied by the outbound policy", denied=True)

        with testing.Kit().on_http(refuse) as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, INPUT)
        self.assertFalse(failed.exception.retryable)
        self.assertTrue(failed.exception.message.endswith("denied by the outbound policy"))

    def test_an_input_without_its_url_is_refused_as_a_booking_would_be(self):
        with testing.Kit() as kit:
            with self.assertRaises(testing.InvalidInput) as failed:
                kit.call(app.run, {"body": {}})
        self.assertFalse(failed.exception.retryable)
        self.assertIn('"url" is a required property', failed.exception.message)
        self.assertEqual(kit.requests, [])

    def test_without_the_schema_check_run_still_names_a_missing_field(self):
        # A run whose input was booked before its schema was (or a plugin without one):
        # the dataclass refuses it, naming the field.
        def bare(ctx, input: app.Input):
            return app.run(ctx, input)

        with testing.Kit() as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(bare, {"body": {}})
        self.assertNotIsInstance(failed.exception, testing.InvalidInput)
        self.assertIn("missing field `url`", failed.exception.message)



def post_three(ctx, url):
    """A run of the SDK's HTTP helpers: a read, two changes, one with its own key."""
    from kairos_guest import http

    http.get(url)
    http.post_json(url, {"n": 1})
    http.request("PUT", url, headers={"Idempotency-Key": "mine"})
    return http.request("DELETE", url).status


class IdempotencyKeyTest(unittest.TestCase):
    def test_requests_that_change_something_carry_the_runs_keys(self):
        ctx = testing.context(plan=PlanKind.DEATH)
        self.assertEqual(ctx.idempotency_key, "test-life:death")
        with testing.Kit().on_http(lambda r: testing.response(200)) as kit:
            kit.call(post_three, "https://a.example/x", ctx)
            kit.call(post_three, "https://a.example/x", ctx)
        keys = [r.header("idempotency-key") for r in kit.requests]
        # GET takes none; the first change the webhook's key, the next ones numbered; a
        # key the plugin set is kept; a retried run sends the same keys.
        self.assertEqual(keys[:4], [None, "test-life:death", "mine", "test-life:death:2"])
        self.assertEqual(keys[4:], keys[:4])


if __name__ == "__main__":
    unittest.main()
