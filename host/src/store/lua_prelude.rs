//! The scripts kairos sends (`Scripts`), and the helpers each is sent with: the top-level definitions of `common.lua` (and
//! `record_bucket.lua`) that its body names, directly or through other helpers, and no
//! others.
//!
//! Redis runs a script's whole text on every call, so every helper defined at its top
//! costs a closure each time, used or not. With the ~90 helpers of layout 4 that was
//! 4–7 µs a call in a tight loop and 25 µs and more when the call comes between other
//! work and its caches are cold (measured in session 14, BENCHMARKS.md): more than most
//! scripts' own work. A page of the Life listing makes one call per shard, a booking one.
//!
//! A top-level definition is a line at column 0 starting with `local ` or `function `,
//! with the lines after it up to the next such line (a function's body, an `end`). Names
//! are found as identifiers anywhere in the text, comments and strings included: a name
//! seen where it is not used only brings in a helper that is not needed, never leaves out
//! one that is.

use std::collections::{BTreeSet, HashSet};

use redis::Script;

/// One top-level definition: the names it defines and its text.
struct Definition<'a> {
    defines: Vec<&'a str>,
    text: String,
}

fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The names a definition's first line defines: `local function f(`, `function f(`,
/// `local a, b = ...`.
fn defined_names(first: &str) -> Vec<&str> {
    let rest = first.strip_prefix("local ").unwrap_or(first);
    if let Some(f) = rest.strip_prefix("function ") {
        return identifiers(f).take(1).collect();
    }
    let names = rest.split('=').next().unwrap_or("");
    identifiers(names).collect()
}

fn definitions(common: &str) -> Vec<Definition<'_>> {
    let mut out: Vec<Definition> = Vec::new();
    for line in common.lines() {
        if line.starts_with("local ") || line.starts_with("function ") {
            out.push(Definition {
                defines: defined_names(line),
                text: format!("{line}\n"),
            });
        } else if line.trim_start().starts_with("--") || line.trim().is_empty() {
            // A comment line or a blank line: not needed.
        } else if let Some(current) = out.last_mut() {
            current.text.push_str(line);
            current.text.push('\n');
        }
    }
    out
}

/// The definitions of `common` that `body` needs, in their order in `common`.
pub(crate) fn prelude_for(common: &str, body: &str) -> String {
    let defs = definitions(common);
    let mut needed: HashSet<&str> = identifiers(body).collect();
    let mut included = BTreeSet::new();
    loop {
        let before = included.len();
        for (i, d) in defs.iter().enumerate() {
            if !included.contains(&i) && d.defines.iter().any(|n| needed.contains(n)) {
                included.insert(i);
                needed.extend(identifiers(&d.text));
            }
        }
        if included.len() == before {
            break;
        }
    }
    included
        .into_iter()
        .map(|i| defs[i].text.as_str())
        .collect()
}

// The scripts themselves, each sent with its prelude.

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {
        /// Every script, each with the helpers of `common.lua` it needs prepended.
        pub(crate) struct Scripts {
            $(pub(crate) $name: Script,)*
            /// `kairos migrate` to layout 3 (from layouts 1 and 2), with the helpers
            /// of that layout (`common3.lua`).
            pub(crate) migrate: Script,
        }

        impl Scripts {
            /// Each script's name and SHA-1: what `EVALSHA`, `SLOWLOG` and `MONITOR` show
            /// of a call.
            pub(crate) fn hashes(&self) -> Vec<(&'static str, String)> {
                vec![
                    $((stringify!($name), self.$name.get_hash().to_string()),)*
                    ("migrate", self.migrate.get_hash().to_string()),
                ]
            }

            pub(super) fn load() -> Self {
                Scripts {
                    $($name: script(include_str!(concat!("scripts/", stringify!($name), ".lua"))),)*
                    migrate: Script::new(&script_with(
                        include_str!("scripts/common3.lua"),
                        include_str!("scripts/migrate.lua"),
                    )),
                }
            }
        }
    };
}

scripts!(
    book,
    debounce,
    life_apply,
    life_load,
    records_get,
    records_get_all,
    lives_page,
    lives_merge,
    pointer,
    claim,
    start_run,
    finish_life,
    release,
    inflight_scan,
    fold4,
    sweep,
    finished_excess,
    shard_stats,
    shard_first,
    timer_put,
    timer_run,
    timer_delete,
    finish_timer,
    timer_dialect,
    queue_put,
    queue_purge,
    queue_resume,
    task_add,
    task_change,
    task_get,
    task_lease,
    task_lease_change,
    finish_task,
    queue_wake,
    shard_takeover,
    shard_renew,
    shard_release,
    plugin_users,
    meta_init,
    idem_begin,
    idem_finish,
    book_idem,
    history_size,
    census_rebuild,
    zset_page,
);

/// A script's text with the helpers of `common.lua` it needs prepended (`lua_prelude.rs`); a first line `#!lua flags=...` (Redis 7)
/// stays first.
fn script(body: &str) -> Script {
    Script::new(&script_text(body))
}

pub(super) fn script_text(body: &str) -> String {
    let common = concat!(
        include_str!("scripts/record_bucket.lua"),
        include_str!("scripts/common.lua"),
        include_str!("scripts/task_records.lua")
    );
    script_with(&prelude_for(common, body), body)
}

pub(super) fn script_with(common: &str, body: &str) -> String {
    match body.strip_prefix("#!lua") {
        Some(rest) => {
            let (flags, rest) = rest.split_once('\n').unwrap_or((rest, ""));
            format!("#!lua{flags}\n{common}\n{rest}")
        }
        None => format!("{common}\n{body}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMON: &str = "\
-- helpers
local PREFIX = ARGV[1]

local function key(id) return PREFIX .. id end
local function unused() return 1 end
-- the one that calls another
local function get(id)
  -- a comment inside
  return redis.call('GET', key(id))
end
local A, B = 1, 2
local T = setmetatable({}, {__index = function(t, n)
  return n
end})
";

    #[test]
    fn only_what_the_body_names_comes_along_with_what_that_names() {
        let p = prelude_for(COMMON, "return get(ARGV[2])");
        assert_eq!(
            p,
            "local PREFIX = ARGV[1]\n\
             local function key(id) return PREFIX .. id end\n\
             local function get(id)\n  return redis.call('GET', key(id))\nend\n"
        );
        assert!(!p.contains("unused"));
    }

    #[test]
    fn multi_name_and_multi_line_definitions_are_kept_whole() {
        assert_eq!(prelude_for(COMMON, "return B"), "local A, B = 1, 2\n");
        assert_eq!(
            prelude_for(COMMON, "return T.x"),
            "local T = setmetatable({}, {__index = function(t, n)\n  return n\nend})\n"
        );
        assert_eq!(prelude_for(COMMON, "return 1"), "");
    }

    /// Every script of the store loads in a real Lua sense: each name a kept helper
    /// calls is kept too (the e2e tests run the scripts against Redis; this checks the
    /// closure of the real common.lua without one).
    #[test]
    fn the_real_helpers_close_over_what_they_call() {
        let common = concat!(
            include_str!("scripts/record_bucket.lua"),
            include_str!("scripts/common.lua"),
            include_str!("scripts/task_records.lua")
        );
        let all = prelude_for(common, common);
        let defs = definitions(common);
        for d in &defs {
            assert!(all.contains(d.text.as_str()), "{:?} left out", d.defines);
        }
        let finish = prelude_for(common, include_str!("scripts/finish_life.lua"));
        assert!(finish.contains("local function put_new_record("));
        assert!(finish.contains("local function split_records("));
        assert!(finish.contains("local function id_hash("));
        let page = prelude_for(common, include_str!("scripts/lives_page.lua"));
        assert!(page.contains("local function tree_range("));
        assert!(!page.contains("local function book_life("));
    }

    #[test]
    fn a_shebang_stays_the_first_line_of_a_script() {
        let text = script_text(include_str!("scripts/finish_life.lua"));
        assert!(
            text.starts_with("#!lua flags=allow-oom\nlocal function id_hash("),
            "{}",
            &text[..80]
        );
        assert_eq!(text.matches("#!lua").count(), 1);
        let text = script_text(include_str!("scripts/records_get.lua"));
        assert!(
            text.starts_with("local function id_hash("),
            "{}",
            &text[..80]
        );
    }

    #[test]
    fn every_script_is_named_by_its_own_hash() {
        let names = crate::store::script_names_by_hash();
        let scripts = Scripts::load();
        assert_eq!(
            names.len(),
            scripts.hashes().len(),
            "two scripts share a hash"
        );
        assert_eq!(
            names.get(scripts.finish_life.get_hash()),
            Some(&"finish_life")
        );
        assert_eq!(names.get(scripts.claim.get_hash()), Some(&"claim"));
    }
}
