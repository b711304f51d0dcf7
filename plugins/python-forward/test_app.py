"""python-forward's run(), natively, with the test kit: python3 -m unittest (from this
directory, with guest-sdk/python on PYTHONPATH)."""

import unittest

from kairos_guest import testing
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

    def test_an_input_without_its_url_fails_for_good_naming_it(self):
        with testing.Kit() as kit:
            with self.assertRaises(testing.Failed) as failed:
                kit.call(app.run, {"body": {}})
        self.assertFalse(failed.exception.retryable)
        self.assertIn("missing field `url`", failed.exception.message)
        self.assertEqual(kit.requests, [])


if __name__ == "__main__":
    unittest.main()
