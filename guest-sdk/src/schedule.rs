//! Booking follow-up work from inside a run: reschedule yourself, or chain actions.

use serde_json::{json, Value};

use crate::bindings::kairos::plugin0_1_0::schedule as wit;

/// Why the host refused a booking: the REST API's error `code` and `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookingError {
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for BookingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for BookingError {}

impl From<wit::BookingError> for BookingError {
    fn from(e: wit::BookingError) -> Self {
        BookingError {
            code: e.code,
            message: e.message,
        }
    }
}

/// Books a Life with `request` as the body of `POST /schedules`; returns its id.
pub fn book(request: &Value) -> Result<String, BookingError> {
    #[cfg(not(target_family = "wasm"))]
    return crate::testing::book(request);
    #[cfg(target_family = "wasm")]
    wit::book(&request.to_string()).map_err(Into::into)
}

/// Books a point Life that runs `action` (a webhook or plugin action, as JSON) at
/// `at_ms` (milliseconds since the Unix epoch).
pub fn book_point(at_ms: i64, action: Value) -> Result<String, BookingError> {
    book(&json!({
        "schedule_type": "point",
        "birth_time": rfc3339_ms(at_ms),
        "birth_action": action,
    }))
}

/// Cancels a Life.
pub fn cancel(life_id: &str) -> Result<(), BookingError> {
    #[cfg(not(target_family = "wasm"))]
    return crate::testing::cancel(life_id);
    #[cfg(target_family = "wasm")]
    wit::cancel(life_id).map_err(Into::into)
}

/// Formats epoch milliseconds as RFC 3339 in UTC (`2026-11-22T06:00:00.250Z`).
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::rfc3339_ms;

    #[test]
    fn formats_epoch_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_795_327_200_250), "2026-11-22T06:00:00.250Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
