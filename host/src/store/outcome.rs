//! What a finished Life came to (SPEC section 2): the seed's states stay, and the outcome
//! tells apart what one state can mean. It is read off the record, never stored: a
//! `Stillbirth` whose birth Plan `Failed` is `birth_failed`, any other `Stillbirth` was
//! `cancelled`; a `Dead` whose death Plan `Failed` is `death_failed`, any other `Dead`
//! `succeeded`; an `Invalidated` is `invalidated`. An unfinished Life has none.
//!
//! The failures (`birth_failed`, `death_failed`, `invalidated`) are also indexed by
//! finish time in the shard's `failed` sorted set, for `GET /failures`.

use std::str::FromStr;

use super::record::LifeRecord;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Cancelled,
    BirthFailed,
    DeathFailed,
    Invalidated,
}

/// Every outcome word, in the order the API documents them.
pub const OUTCOMES: [&str; 5] = [
    "succeeded",
    "cancelled",
    "birth_failed",
    "death_failed",
    "invalidated",
];

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Cancelled => "cancelled",
            Outcome::BirthFailed => "birth_failed",
            Outcome::DeathFailed => "death_failed",
            Outcome::Invalidated => "invalidated",
        }
    }

    /// A failure: indexed for `GET /failures`.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::BirthFailed | Outcome::DeathFailed | Outcome::Invalidated
        )
    }

    /// The Life state this outcome ends in.
    pub fn state(self) -> &'static str {
        match self {
            Outcome::Succeeded | Outcome::DeathFailed => "Dead",
            Outcome::Cancelled | Outcome::BirthFailed => "Stillbirth",
            Outcome::Invalidated => "Invalidated",
        }
    }

    /// The outcome of a finished Life, and why when it failed (the failed Plan's last
    /// error); None while it is unfinished.
    pub fn of(rec: &LifeRecord) -> Option<(Outcome, Option<String>)> {
        let failed = |death: bool| rec.plan(death).state.as_deref() == Some("Failed");
        let error = |death: bool| rec.plan(death).last_error.clone();
        match rec.state.as_str() {
            "Stillbirth" if failed(false) => Some((Outcome::BirthFailed, error(false))),
            "Stillbirth" => Some((Outcome::Cancelled, None)),
            "Dead" if failed(true) => Some((Outcome::DeathFailed, error(true))),
            "Dead" => Some((Outcome::Succeeded, None)),
            "Invalidated" => Some((
                Outcome::Invalidated,
                Some(error(false).unwrap_or_else(|| {
                    "its birth could not start within birth_delay_limit_time of its time".into()
                })),
            )),
            _ => None,
        }
    }
}

impl FromStr for Outcome {
    type Err = ();

    fn from_str(s: &str) -> Result<Outcome, ()> {
        Ok(match s {
            "succeeded" => Outcome::Succeeded,
            "cancelled" => Outcome::Cancelled,
            "birth_failed" => Outcome::BirthFailed,
            "death_failed" => Outcome::DeathFailed,
            "invalidated" => Outcome::Invalidated,
            _ => return Err(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::PlanRecord;

    fn record(state: &str, birth: Option<&str>, death: Option<&str>) -> LifeRecord {
        let mut rec = LifeRecord::from_json(
            r#"{"b":1,"d":2,"c":0,"a":{"path":"/a","method":"POST"},"x":{"path":"/b","method":"POST"}}"#,
        )
        .unwrap();
        rec.state = state.into();
        let plan = |s: Option<&str>| {
            let mut plan = PlanRecord::default();
            plan.state = s.map(str::to_string);
            plan.last_error = s.map(|s| format!("{s} because"));
            plan
        };
        rec.birth = plan(birth);
        rec.death = plan(death);
        rec
    }

    #[test]
    fn one_state_reads_as_the_outcome_that_led_to_it() {
        let of = |s, b, d| Outcome::of(&record(s, b, d)).map(|(o, why)| (o.as_str(), why));
        assert_eq!(of("Inexistent", None, None), None);
        assert_eq!(of("Alive", Some("Done"), None), None);
        assert_eq!(
            of("Stillbirth", Some("Failed"), Some("Cancelled")),
            Some(("birth_failed", Some("Failed because".into())))
        );
        assert_eq!(
            of("Stillbirth", Some("Cancelled"), Some("Cancelled")),
            Some(("cancelled", None))
        );
        assert_eq!(
            of("Dead", Some("Done"), Some("Failed")),
            Some(("death_failed", Some("Failed because".into())))
        );
        assert_eq!(
            of("Dead", Some("Done"), Some("Done")),
            Some(("succeeded", None))
        );
        assert_eq!(
            of("Invalidated", Some("Invalidated"), Some("Cancelled")),
            Some(("invalidated", Some("Invalidated because".into())))
        );
        let (o, why) = Outcome::of(&record("Invalidated", None, None)).unwrap();
        assert!(o.is_failure() && why.unwrap().contains("birth_delay_limit_time"));
    }

    #[test]
    fn words_read_back_and_name_their_state() {
        for word in OUTCOMES {
            let o: Outcome = word.parse().unwrap();
            assert_eq!(o.as_str(), word);
            let rec = match o {
                Outcome::Succeeded => record("Dead", Some("Done"), None),
                Outcome::Cancelled => record("Stillbirth", Some("Cancelled"), None),
                Outcome::BirthFailed => record("Stillbirth", Some("Failed"), None),
                Outcome::DeathFailed => record("Dead", Some("Done"), Some("Failed")),
                Outcome::Invalidated => record("Invalidated", Some("Invalidated"), None),
            };
            assert_eq!(Outcome::of(&rec).unwrap().0, o);
            assert_eq!(rec.state, o.state());
        }
        assert!("failed".parse::<Outcome>().is_err());
    }
}
