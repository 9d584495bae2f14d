//! CPU seconds this process's threads have used, from `/proc/self/task`,
//! so each perf report shows which stage bounds the run: the store's
//! threads are named (`dw-dispatch`, `dw-tick`, ...), and a
//! stage that used about one core's worth of the run is the bottleneck.

use std::collections::BTreeMap;

/// CPU seconds of threads that exited before the report, by name (summed):
/// what the producers and the consumers report as they end.
#[derive(Default)]
pub struct Exited(BTreeMap<String, f64>);

impl Exited {
    pub fn add(&mut self, name: &str, secs: f64) {
        *self.0.entry(name.to_owned()).or_default() += secs;
    }

    /// The seconds reported under `name`.
    pub fn of(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }
}

/// CPU seconds per live thread name (threads of one name summed), with
/// those of `exited`, and the whole process's (which also counts threads
/// that have exited). A thread's time is the scheduler's
/// `se.sum_exec_runtime` (ns) where the kernel has `/proc/.../sched`, else
/// its `stat` ticks (10 ms: a short run reads 0).
pub fn report(exited: &Exited) -> serde_json::Value {
    let mut threads: BTreeMap<String, f64> = exited.0.clone();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Some((name, secs)) = task_secs(&task.path()) {
                *threads.entry(name).or_default() += secs;
            }
        }
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let process = parse_stat(&stat).map_or(0.0, |(_, used)| used as f64 / ticks());
    serde_json::json!({ "process": process, "threads": threads })
}

/// The CPU seconds the calling thread has used so far.
pub fn this_thread_secs() -> f64 {
    task_secs(std::path::Path::new("/proc/thread-self")).map_or(0.0, |(_, secs)| secs)
}

/// The name and CPU seconds of the task whose `/proc` directory is `task`.
fn task_secs(task: &std::path::Path) -> Option<(String, f64)> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    let (name, used) = parse_stat(&stat)?;
    let sched = std::fs::read_to_string(task.join("sched")).unwrap_or_default();
    Some((name.to_owned(), exec_runtime_secs(&sched).unwrap_or(used as f64 / ticks())))
}

fn ticks() -> f64 {
    rustix::param::clock_ticks_per_second() as f64
}

/// `se.sum_exec_runtime` of a `sched` file (milliseconds, six decimals), in seconds.
fn exec_runtime_secs(sched: &str) -> Option<f64> {
    let line = sched.lines().find(|l| l.starts_with("se.sum_exec_runtime"))?;
    let ms: f64 = line.rsplit(':').next()?.trim().parse().ok()?;
    Some(ms / 1000.0)
}

/// The name and the CPU ticks (user and system) in a `stat` file: `pid
/// (name) state ...`, where the name may hold spaces and parentheses, and
/// `utime` and `stime` are the 14th and 15th fields.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at the 3rd field (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_with_spaces_and_parentheses_is_read_whole() {
        let stat = "4242 (perf (x) 1) R 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 1 0 99 0 0";
        assert_eq!(parse_stat(stat), Some(("perf (x) 1", 281)));
        assert_eq!(parse_stat("garbage"), None);
        let sched = "perf (4242, #threads: 9)\n---\nse.exec_start    :   11980190.347142\nse.sum_exec_runtime   :    1234.500000\n";
        assert_eq!(exec_runtime_secs(sched), Some(1.2345));
        assert_eq!(exec_runtime_secs("nothing"), None);
    }

    #[test]
    fn this_thread_shows_up_by_its_name() {
        let report = std::thread::Builder::new()
            .name("cpu-probe".into())
            .spawn(|| {
                // Burn CPU until the process's count (in clock ticks, 10 ms)
                // is above zero: a release build's short burn may not be.
                let started = std::time::Instant::now();
                let mut x = 0u64;
                loop {
                    for i in 0..1_000_000u64 {
                        x = x.wrapping_mul(31).wrapping_add(i);
                    }
                    std::hint::black_box(x);
                    let report = report(&Exited::default());
                    if report["process"].as_f64().is_some_and(|cpu| cpu > 0.0)
                        || started.elapsed().as_secs() > 10
                    {
                        return report;
                    }
                }
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(report["threads"]["cpu-probe"].as_f64().is_some(), "{report}");
        assert!(report["process"].as_f64().unwrap() > 0.0, "{report}");
    }
}
