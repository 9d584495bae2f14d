//! The legacy delay levels (RocketMQ 4 style): level *k* means "deliver
//! `table[k-1]` after the store time". A level is only an offset on the wheel.

use std::time::Duration;

use crate::config::DEFAULT_DELAY_LEVELS;
use crate::error::{Error, Result};

/// A parsed level table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayLevels {
    delays_ms: Vec<u64>,
}

impl DelayLevels {
    /// Parses a space-separated table of `<number><unit>` with units `s`, `m`, `h`, `d`.
    pub fn parse(table: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid("delay level table", why);
        let delays_ms = table
            .split_whitespace()
            .map(|item| {
                let (number, unit) =
                    item.split_at(item.len() - item.chars().last().map_or(0, char::len_utf8));
                let scale: u64 = match unit {
                    "s" => 1_000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    "d" => 86_400_000,
                    _ => return Err(bad(format!("{item:?} needs a unit of s, m, h or d"))),
                };
                let n: u64 = number.parse().map_err(|_| bad(format!("{item:?} is not <number><unit>")))?;
                if n == 0 {
                    return Err(bad(format!("{item:?} is not a delay")));
                }
                n.checked_mul(scale).ok_or_else(|| bad(format!("{item:?} is too long")))
            })
            .collect::<Result<Vec<_>>>()?;
        if delays_ms.is_empty() {
            return Err(bad("no levels".into()));
        }
        if delays_ms.len() > u16::MAX as usize {
            return Err(bad("more than 65535 levels".into()));
        }
        Ok(Self { delays_ms })
    }

    /// The delay of level `level` (1-based).
    pub fn delay_ms(&self, level: u16) -> Result<u64> {
        let index = usize::from(level).checked_sub(1);
        index.and_then(|i| self.delays_ms.get(i).copied()).ok_or_else(|| {
            Error::invalid("delay level", format!("{level} is not between 1 and {}", self.delays_ms.len()))
        })
    }

    /// How many levels there are.
    pub fn len(&self) -> usize {
        self.delays_ms.len()
    }

    /// Whether the table has no levels (never, for a parsed table).
    pub fn is_empty(&self) -> bool {
        self.delays_ms.is_empty()
    }

    /// The delays of levels 1, 2, … in order.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + '_ {
        self.delays_ms.iter().map(|&ms| Duration::from_millis(ms))
    }
}

impl Default for DelayLevels {
    fn default() -> Self {
        Self::parse(DEFAULT_DELAY_LEVELS).expect("the default table parses")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_table_is_rocketmqs() {
        let levels = DelayLevels::default();
        assert_eq!(levels.len(), 18);
        assert_eq!(levels.delay_ms(1).unwrap(), 1_000);
        assert_eq!(levels.delay_ms(16).unwrap(), 30 * 60_000);
        assert_eq!(levels.delay_ms(18).unwrap(), 2 * 3_600_000);
        assert!(levels.delay_ms(0).is_err());
        assert_eq!(
            levels.delay_ms(19).unwrap_err().to_string(),
            "invalid delay level: 19 is not between 1 and 18"
        );
    }

    #[test]
    fn tables_with_days_and_errors() {
        assert_eq!(DelayLevels::parse("2d 12h").unwrap().delay_ms(1).unwrap(), 2 * 86_400_000);
        for bad in ["", "5", "5x", "s", "0s", "1.5m", "-1s", "99999999999999999999d"] {
            assert!(DelayLevels::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
