//! The REST API's own series: requests by route template, method and status
//! (`kairos_http_requests_total`), and how long they took to answer by route and method
//! (`kairos_http_request_duration_seconds`), so that API errors and booking latency can
//! be alerted on from kairos itself. Routes are templates (`/schedules/{life_uuid}`),
//! never paths, and a request no route matched counts under `unmatched`: the series stay
//! as few as the routes, whatever clients send.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the API latency histogram's buckets.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Methods counted by name; any other is counted as `other`.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// The `route` label of requests that matched no route.
pub const UNMATCHED: &str = "unmatched";

#[derive(Default)]
struct RouteStats {
    statuses: BTreeMap<u16, u64>,
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum_us: u64,
}

/// Request counts and latencies by route template, then method: a request of a route
/// seen before is counted without allocating.
#[derive(Default)]
pub struct HttpMetrics {
    routes: Mutex<BTreeMap<String, BTreeMap<&'static str, RouteStats>>>,
}

impl HttpMetrics {
    /// Counts one answered request: its route template (`None`: no route matched), its
    /// method, the status answered and the time to answer.
    pub fn observe(
        &self,
        route: Option<&str>,
        method: &str,
        status: u16,
        elapsed: std::time::Duration,
    ) {
        let method = METHODS
            .into_iter()
            .find(|m| *m == method)
            .unwrap_or("other");
        let route = route.unwrap_or(UNMATCHED);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let secs = elapsed.as_secs_f64();
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let methods = match routes.get_mut(route) {
            Some(methods) => methods,
            None => routes.entry(route.to_string()).or_default(),
        };
        let stats = methods.entry(method).or_default();
        *stats.statuses.entry(status).or_default() += 1;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&mut stats.buckets) {
            if secs <= *bound {
                *bucket += 1;
            }
        }
        stats.count += 1;
        stats.sum_us = stats.sum_us.saturating_add(us);
    }

    /// Appends both series to `out`.
    pub fn render(&self, out: &mut String) {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(
            out,
            "# HELP kairos_http_requests_total Requests to the REST API answered by this host, by route template, method and status.\n# TYPE kairos_http_requests_total counter"
        );
        for (route, method, stats) in flat(&routes) {
            let route = super::label_value(route);
            for (status, n) in &stats.statuses {
                let _ = writeln!(
                    out,
                    "kairos_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP kairos_http_request_duration_seconds How long the REST API took to answer a request (to its response's head), by route template and method.\n# TYPE kairos_http_request_duration_seconds histogram"
        );
        for (route, method, stats) in flat(&routes) {
            let labels = format!(
                "route=\"{}\",method=\"{method}\"",
                super::label_value(route)
            );
            for (bound, n) in LATENCY_BUCKETS.iter().zip(&stats.buckets) {
                let _ = writeln!(
                    out,
                    "kairos_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "kairos_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}\nkairos_http_request_duration_seconds_sum{{{labels}}} {}\nkairos_http_request_duration_seconds_count{{{labels}}} {}",
                stats.count,
                stats.sum_us as f64 / 1e6,
                stats.count
            );
        }
    }
}

/// Every (route, method) and its figures, in order.
fn flat<'a>(
    routes: &'a BTreeMap<String, BTreeMap<&'static str, RouteStats>>,
) -> impl Iterator<Item = (&'a str, &'static str, &'a RouteStats)> {
    routes
        .iter()
        .flat_map(|(route, methods)| methods.iter().map(move |(m, s)| (route.as_str(), *m, s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_by_template_method_and_status_with_a_cumulative_histogram() {
        let m = HttpMetrics::default();
        let route = Some("/schedules/{life_uuid}");
        m.observe(route, "GET", 200, Duration::from_micros(800));
        m.observe(route, "GET", 404, Duration::from_millis(20));
        m.observe(route, "BREW", 405, Duration::from_millis(3));
        m.observe(None, "GET", 404, Duration::from_millis(1));
        let mut text = String::new();
        m.render(&mut text);
        for line in [
            "kairos_http_requests_total{route=\"/schedules/{life_uuid}\",method=\"GET\",status=\"200\"} 1\n",
            "kairos_http_requests_total{route=\"/schedules/{life_uuid}\",method=\"GET\",status=\"404\"} 1\n",
            "kairos_http_requests_total{route=\"/schedules/{life_uuid}\",method=\"other\",status=\"405\"} 1\n",
            "kairos_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 1\n",
            "kairos_http_request_duration_seconds_bucket{route=\"/schedules/{life_uuid}\",method=\"GET\",le=\"0.001\"} 1\n",
            "kairos_http_request_duration_seconds_bucket{route=\"/schedules/{life_uuid}\",method=\"GET\",le=\"0.01\"} 1\n",
            "kairos_http_request_duration_seconds_bucket{route=\"/schedules/{life_uuid}\",method=\"GET\",le=\"0.025\"} 2\n",
            "kairos_http_request_duration_seconds_bucket{route=\"/schedules/{life_uuid}\",method=\"GET\",le=\"+Inf\"} 2\n",
            "kairos_http_request_duration_seconds_sum{route=\"/schedules/{life_uuid}\",method=\"GET\"} 0.0208\n",
            "kairos_http_request_duration_seconds_count{route=\"unmatched\",method=\"GET\"} 1\n",
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        assert!(!text.contains("BREW"));
    }
}
