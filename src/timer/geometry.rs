//! The wheel's geometry: its levels, where a timer goes, which slot holds
//! which window, and when a window is still live. Pure arithmetic, shared by
//! the wheel, its gauges, retention and `wheel-dump`.
//!
//! | level | slot covers | slots | level spans |
//! |---|---|---|---|
//! | 0 | 1 s | 2^16 + 64 | 18.2 h |
//! | 1 | 2^15 s (9.1 h) | 2^13 | 8.5 years |
//! | 2 | 2^27 s (4.25 years) | 2^11 | 8,700 years |
//!
//! Level 0 holds every timer due within about 2^16 s (18.2 h) of the oldest
//! second still holding undelivered timers, so the legacy range (up to 2 h)
//! and business delays of hours never leave it; the slot of such a second is
//! never reused for a later one (see [`place`]).
//! A coarser window is *cascaded* one window before it begins: window `w` of
//! level 1 is re-indexed into level 0 when second `(w - 1) * 2^15` is loaded,
//! and at that moment all of it fits level 0 (it ends before `s + 2^16`).
//! Level 2 cascades into level 1 the same way. So a timer is re-indexed at most
//! once per level it descends. Level 2 reaches past the year 9999, the latest
//! deliver time accepted.

/// One level of the wheel.
#[derive(Debug, Clone, Copy)]
pub struct Level {
    /// A slot covers `1 << window_shift` seconds.
    pub window_shift: u32,
    /// How many slots the level has.
    pub slots: u64,
}

/// The levels, finest first.
pub const LEVELS: [Level; 3] = [
    Level { window_shift: 0, slots: (1 << 16) + LOAD_AHEAD },
    Level { window_shift: 15, slots: 1 << 13 },
    Level { window_shift: 27, slots: 1 << 11 },
];
/// How many levels the wheel has.
pub const LEVEL_COUNT: usize = LEVELS.len();
/// How many seconds the wheel may load past the oldest second still holding
/// undelivered timers (its tick second).
pub const LOAD_AHEAD: u64 = 64;
/// Level 0 takes a timer due before `tick second + L0_SPAN`: its slot count,
/// so no slot of a second that may still hold undelivered timers (or be
/// reloaded after a restart) is reused for a later second. A level-1 window
/// cascaded one window early, with the tick second at most `LOAD_AHEAD`
/// behind, fits whole.
pub const L0_SPAN: u64 = LEVELS[0].slots;
/// Slot records in the wheel file, over all levels.
pub const TOTAL_SLOTS: u64 = LEVELS[0].slots + LEVELS[1].slots + LEVELS[2].slots;
/// The wheel file's exact size: its header, then one slot record per slot.
pub const WHEEL_FILE_LEN: u64 =
    crate::format::FILE_HEADER_LEN as u64 + TOTAL_SLOTS * crate::format::slot::SLOT_LEN as u64;
/// The `timer/tails` file's exact size: its header, then one record per slot.
pub const TAILS_FILE_LEN: u64 =
    crate::format::FILE_HEADER_LEN as u64 + TOTAL_SLOTS * crate::format::tail::TAIL_LEN as u64;
/// The wheel file header's `a`: which geometry the file was laid out for.
pub const GEOMETRY_ID: u64 = 0x0210_0F0D_1B0B;

/// Index of the slot holding `window` of `level`, counted over all levels.
pub fn slot_index(level: usize, window: u64) -> u64 {
    let first: u64 = LEVELS[..level].iter().map(|l| l.slots).sum();
    first + window % LEVELS[level].slots
}

/// The level and window position of slot `index` (counted over all
/// levels), or `None` past the last slot.
pub fn slot_level(index: u64) -> Option<(usize, u64)> {
    let mut first = 0;
    for (level, l) in LEVELS.iter().enumerate() {
        if index < first + l.slots {
            return Some((level, index - first));
        }
        first += l.slots;
    }
    None
}

/// The window of `level` that holds epoch second `second`.
pub fn window_of(level: usize, second: u64) -> u64 {
    second >> LEVELS[level].window_shift
}

/// The first epoch second of `window` on `level`.
pub fn window_start(level: usize, window: u64) -> u64 {
    window.saturating_mul(1 << LEVELS[level].window_shift)
}

/// The level and window a timer due in second `sec` goes to, when `cur` is the
/// next second to load and `tick` the oldest second that may hold undelivered
/// timers. `None`: it is due already.
pub fn place(sec: u64, cur: u64, tick: u64) -> Option<(usize, u64)> {
    if sec < cur {
        return None;
    }
    if sec < tick.min(cur) + L0_SPAN {
        return Some((0, sec));
    }
    let (w1, c1) = (window_of(1, sec), window_of(1, cur));
    if w1 - c1 < LEVELS[1].slots {
        return Some((1, w1));
    }
    Some((2, window_of(2, sec)))
}

/// Whether `window` of `level` (1 or 2) still waits to be cascaded, once
/// every second up to `loaded_through` is loaded.
pub fn not_yet_cascaded(level: usize, window: u64, loaded_through: u64) -> bool {
    window > window_of(level, loaded_through) + 1
}

/// Whether a slot holding `window` of `level` still holds unloaded timers
/// once every second up to `loaded_through` is loaded: a later level-0
/// second, or a coarser window not yet cascaded.
pub fn is_live(level: usize, window: u64, loaded_through: u64) -> bool {
    match level {
        0 => window > loaded_through,
        _ => not_yet_cascaded(level, window, loaded_through),
    }
}

/// [`is_live`] for a wheel resumed at `tick_second` (a checkpoint's): it
/// has loaded every second before it.
pub fn slot_is_live(level: usize, window: u64, tick_second: u64) -> bool {
    // At second 0 nothing has been loaded: saturating, as for every tick second below.
    is_live(level, window, tick_second.saturating_sub(1))
}

/// Which timer log a slot of `level` chains through: `0`, the near log, for
/// level 0 (read within a day); `1`, the far log, for levels 1 and 2.
pub fn timer_log_of(level: usize) -> usize {
    usize::from(level > 0)
}

/// Pending timers per level from the entries of unloaded slots (`entries`)
/// and how many of them are cancel entries (`cancels`).
pub fn net_pending(entries: [u64; LEVEL_COUNT], cancels: [u64; LEVEL_COUNT]) -> [u64; LEVEL_COUNT] {
    // Cancel entries are not timers, and each removes one timer on its own
    // level or a coarser one (where the timer waits to cascade).
    let mut counts = entries;
    let mut carry = 0;
    for (count, cancels) in counts.iter_mut().zip(cancels) {
        debug_assert!(*count >= cancels, "a level holds {cancels} cancel entries among {count} entries");
        *count -= cancels.min(*count);
        let remove = cancels + carry;
        let taken = remove.min(*count);
        *count -= taken;
        carry = remove - taken;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_boundaries() {
        let cur = 1 << 20;
        assert_eq!(place(cur - 1, cur, cur), None, "a past second is due");
        assert_eq!(place(cur, cur, cur), Some((0, cur)));
        assert_eq!(place(cur + L0_SPAN - 1, cur, cur), Some((0, cur + L0_SPAN - 1)));
        assert_eq!(place(cur + L0_SPAN, cur, cur), Some((1, (cur + L0_SPAN) >> 15)));
        // An older undelivered second keeps its slot from being reused.
        assert_eq!(place(cur + L0_SPAN - 1, cur, cur - 1), Some((1, (cur + L0_SPAN - 1) >> 15)));
        let l1_limit = ((cur >> 15) + LEVELS[1].slots) << 15;
        assert_eq!(place(l1_limit - 1, cur, cur), Some((1, (l1_limit - 1) >> 15)));
        assert_eq!(place(l1_limit, cur, cur), Some((2, l1_limit >> 27)));
        let last = crate::message::MAX_DELIVER_AT_MS / 1000;
        assert!(last >> 27 < LEVELS[2].slots, "level 2 reaches past the year 9999 without wrapping");
    }

    #[test]
    fn slot_geometry_matches_wheel_format_md() {
        // wheel-format.md: first_slot is 0, 65,600, 73,792; 75,840 slots in all.
        assert_eq!([0, 1, 2].map(|l| slot_index(l, 0)), [0, 65_600, 73_792]);
        assert_eq!(TOTAL_SLOTS, 75_840);
        assert_eq!(slot_level(65_599), Some((0, 65_599)));
        assert_eq!(slot_level(65_600), Some((1, 0)));
        assert_eq!(slot_level(75_839), Some((2, 2047)));
        assert_eq!(slot_level(75_840), None);
        assert_eq!(window_of(1, 1 << 15), 1);
        assert_eq!(window_start(2, 1), 1 << 27);
        // A level-0 second is live from the tick second on.
        assert!(slot_is_live(0, 100, 100) && !slot_is_live(0, 99, 100));
        assert_eq!([0, 1, 2].map(timer_log_of), [0, 1, 1]);
    }

    #[test]
    fn cancel_entries_remove_timers_on_their_level_or_a_coarser_one() {
        // Level 0: 5 entries, 1 a cancel; level 1: 2 entries, both cancels of
        // timers still on level 2 (4 entries).
        assert_eq!(net_pending([5, 2, 4], [1, 2, 0]), [3, 0, 2]);
    }
}
