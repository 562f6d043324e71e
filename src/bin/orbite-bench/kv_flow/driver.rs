//! kv-flow's driver: the prefill and decode processes spawned from this
//! binary, their JSON lines read as events, the steps counted, and the
//! fault (`kill-decode`, `freeze-prefill`) injected at the middle step.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Src {
    Prefill,
    Decode(usize),
}

/// A line from a child (None: its stdout ended).
pub(super) struct Ev {
    pub(super) src: Src,
    pub(super) line: Option<Value>,
}

pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) pid: u32,
    pub(super) exited: bool,
}

impl Proc {
    fn spawn(args: &[String], src: Src, tx: &mpsc::Sender<Ev>) -> Proc {
        let exe = std::env::current_exe().unwrap_or_else(|e| crate::die(&format!("current_exe: {e}")));
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| crate::die(&format!("spawn {src:?}: {e}")));
        let out = child.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str(&line).unwrap_or_else(|_| json!({"event": "text", "text": line}));
                if tx.send(Ev { src, line: Some(v) }).is_err() {
                    return;
                }
            }
            let _ = tx.send(Ev { src, line: None });
        });
        let pid = child.id();
        Proc { stdin: child.stdin.take(), child, pid, exited: false }
    }

    fn send(&mut self, cmd: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{cmd}").and_then(|_| s.flush());
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid as i32, sig) };
    }

    fn reap(&mut self) -> Option<i32> {
        self.exited = true;
        drop(self.stdin.take());
        self.child.wait().ok().map(|s| s.code().unwrap_or(-1))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[derive(Default)]
pub(super) struct DecodeState {
    pub(super) ready: Option<Value>,
    pub(super) steps: Vec<Value>,
    pub(super) done: Option<Value>,
    pub(super) closed: Option<Value>,
    pub(super) eof: bool,
    pub(super) killed: bool,
    pub(super) fatal: Option<String>,
    pub(super) exit: Option<i32>,
    /// The driver told it to stop stepping.
    pub(super) stop_sent: bool,
}

#[derive(Default)]
pub(super) struct Fault {
    /// When it happened: the SIGKILL, or the SIGSTOP and the SIGCONT.
    pub(super) t_kill: Option<f64>,
    pub(super) t_stop: Option<f64>,
    pub(super) t_cont: Option<f64>,
    pub(super) cont_at: Option<Instant>,
    pub(super) at_step: Option<u64>,
}

pub(super) struct Driver {
    pub(super) o: KvOpts,
    pub(super) rx: mpsc::Receiver<Ev>,
    pub(super) prefill: Proc,
    pub(super) prefill_ready: Value,
    pub(super) decodes: Vec<Proc>,
    pub(super) states: Vec<DecodeState>,
    pub(super) fault: Fault,
    pub(super) prefill_events: Vec<Value>,
}

impl Driver {
    /// The next line of any child, serving the freeze's SIGCONT on time.
    fn next(&mut self) -> Result<Ev, String> {
        let idle = Duration::from_secs_f64(self.o.idle_timeout_s);
        let start = Instant::now();
        loop {
            let mut wait = idle.saturating_sub(start.elapsed());
            if let Some(at) = self.fault.cont_at {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            match self.rx.recv_timeout(wait) {
                Ok(ev) => return Ok(ev),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err("every child's output ended".into()),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if self.fault.cont_at.is_some_and(|at| Instant::now() >= at) {
                self.cont();
            } else if start.elapsed() >= idle {
                return Err(format!("no line from any process for {:.0} s", self.o.idle_timeout_s));
            }
        }
    }

    fn cont(&mut self) {
        self.fault.cont_at = None;
        self.prefill.signal(libc::SIGCONT);
        self.fault.t_cont = Some(mono());
        eprintln!("kv-flow: SIGCONT to the prefill");
    }

    /// Records a decode's line; injects the fault at its moment.
    fn on_decode(&mut self, i: usize, v: Option<Value>) -> Result<(), String> {
        let Some(v) = v else {
            self.states[i].eof = true;
            return Ok(());
        };
        match v["event"].as_str().unwrap_or("") {
            "ready" => self.states[i].ready = Some(v),
            "step_start" => {
                let step = v["step"].as_u64().unwrap_or(0);
                if i == 0 && step == self.o.steps / 2 && self.fault.at_step.is_none() {
                    self.inject(step)?;
                }
            }
            "step" => {
                self.states[i].steps.push(v);
                self.maybe_stop(i);
            }
            "done" => self.states[i].done = Some(v),
            "closed" => self.states[i].closed = Some(v),
            "fatal" => {
                let m = v["message"].as_str().unwrap_or("").to_string();
                self.states[i].fatal = Some(m.clone());
                return Err(format!("decode {i}: {m}"));
            }
            _ => eprintln!("kv-flow: decode {i}: {v}"),
        }
        Ok(())
    }

    /// Tells decode `i` to stop once it has its OK steps and, with a fault,
    /// two OK steps that started after the fault was over (the kill, or
    /// the SIGCONT): recovery is then measured on steps that really ran
    /// after it, however little the fault slowed the decodes.
    fn maybe_stop(&mut self, i: usize) {
        let st = &self.states[i];
        if st.stop_sent || st.killed {
            return;
        }
        let ok = |s: &&Value| s["ok"] == true;
        if (st.steps.iter().filter(ok).count() as u64) < self.o.steps {
            return;
        }
        let over = match self.o.fault.as_str() {
            "kill-decode" => self.fault.t_kill,
            "freeze-prefill" => self.fault.t_cont,
            _ => Some(f64::NEG_INFINITY),
        };
        let Some(t0) = over else { return };
        let after = st.steps.iter().filter(|s| s["t_start"].as_f64().unwrap_or(0.0) >= t0).filter(ok).count();
        if after < 2 {
            return;
        }
        self.states[i].stop_sent = true;
        self.decodes[i].send("stop");
    }

    fn inject(&mut self, step: u64) -> Result<(), String> {
        match self.o.fault.as_str() {
            "kill-decode" => {
                self.fault.at_step = Some(step);
                self.fault.t_kill = Some(mono());
                self.decodes[0].signal(libc::SIGKILL);
                self.states[0].exit = self.decodes[0].reap();
                self.states[0].killed = true;
                eprintln!("kv-flow: SIGKILL to decode 0 at the start of its step {step}");
            }
            "freeze-prefill" => {
                self.fault.at_step = Some(step);
                self.prefill.signal(libc::SIGSTOP);
                let mut status = 0;
                // SAFETY: waitpid on our own child; reports the completed
                // group stop without reaping it.
                let r = unsafe { libc::waitpid(self.prefill.pid as i32, &mut status, libc::WUNTRACED) };
                if r != self.prefill.pid as i32 || !libc::WIFSTOPPED(status) {
                    return Err(format!("the prefill did not stop (waitpid {r}, status {status})"));
                }
                self.fault.t_stop = Some(mono());
                self.fault.cont_at = Some(Instant::now() + Duration::from_secs_f64(self.o.freeze_seconds));
                eprintln!("kv-flow: SIGSTOP to the prefill at decode 0's step {step}");
            }
            _ => {}
        }
        Ok(())
    }

    fn prefill_line(&mut self, v: Option<Value>) -> Result<(), String> {
        match v {
            None => Err("the prefill's output ended".into()),
            Some(v) if v["event"] == "fatal" => Err(format!("prefill: {}", v["message"])),
            Some(v) => {
                self.prefill_events.push(v);
                Ok(())
            }
        }
    }

    /// Waits for the prefill's reply `event`.
    fn prefill_reply(&mut self, event: &str) -> Result<Value, String> {
        loop {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => {
                    self.prefill_line(ev.line)?;
                    let last = self.prefill_events.last().cloned().unwrap_or(Value::Null);
                    if last["event"] == event {
                        return Ok(last);
                    }
                }
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
    }

    fn run(&mut self) -> Result<Value, String> {
        while self.states.iter().any(|s| s.ready.is_none()) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => {
                    if ev.line.is_none() {
                        return Err(format!("decode {i} exited before it was ready"));
                    }
                    self.on_decode(i, ev.line)?
                }
            }
        }
        let t_go = mono();
        for d in &mut self.decodes {
            d.send("go");
        }
        // Until every decode is done (or gone).
        while self.states.iter().any(|s| s.done.is_none() && !s.eof) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
        if self.fault.cont_at.is_some() {
            self.cont();
        }
        for (i, d) in self.decodes.iter_mut().enumerate() {
            if !self.states[i].killed {
                d.send("close");
            }
        }
        while self.states.iter().any(|s| s.closed.is_none() && !s.eof) {
            let ev = self.next()?;
            match ev.src {
                Src::Prefill => self.prefill_line(ev.line)?,
                Src::Decode(i) => self.on_decode(i, ev.line)?,
            }
        }
        for (i, d) in self.decodes.iter_mut().enumerate() {
            if !self.states[i].killed {
                self.states[i].exit = d.reap();
            }
        }
        self.prefill.send("verify");
        let verify = self.prefill_reply("verify")?;
        self.prefill.send("stats");
        let stats = self.prefill_reply("stats")?;
        self.prefill.send("close");
        let closed = self.prefill_reply("closed")?;
        let exit = self.prefill.reap();
        Ok(json!({"t_go": t_go, "verify": verify, "stats": stats["stats"], "closed": closed, "exit": exit}))
    }
}

pub(super) fn role_args(o: &KvOpts) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--decodes".into(),
        o.decodes.to_string(),
        "--pool".into(),
        o.pool.to_string(),
        "--block-size".into(),
        o.block_size.to_string(),
        "--read-blocks".into(),
        o.read_blocks.to_string(),
        "--write-blocks".into(),
        o.write_blocks.to_string(),
        "--close-timeout".into(),
        o.close_timeout_s.to_string(),
    ];
    a.extend(["--seed".into(), o.seed.to_string()]);
    a
}

/// The driver: the roles spawned, the run driven to its end, its summary
/// printed (and written with `--json`).
pub(super) fn run_driver(o: &KvOpts) {
    let (tx, rx) = mpsc::channel();
    let mut pa = vec!["--mode".to_string(), "kv-prefill".into(), "--prefill-config".into(), o.prefill_config.clone()];
    pa.extend(role_args(o));
    let prefill = Proc::spawn(&pa, Src::Prefill, &tx);
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs_f64(o.idle_timeout_s)) {
            Ok(Ev { src: Src::Prefill, line: Some(v) }) if v["event"] == "ready" => break v,
            Ok(Ev { src: Src::Prefill, line: Some(v) }) if v["event"] == "fatal" => {
                crate::die(&format!("the prefill failed: {}", v["message"]))
            }
            Ok(Ev { line: Some(v), .. }) => eprintln!("kv-flow: prefill: {v}"),
            _ => crate::die("the prefill did not start"),
        }
    };
    let endpoint = ready["endpoint"].as_str().unwrap_or("").to_string();
    let addr = ready["addr"].as_u64().unwrap_or(0);
    let decodes: Vec<Proc> = (0..o.decodes)
        .map(|i| {
            let mut a = vec!["--mode".to_string(), "kv-decode".into(), "--index".into(), i.to_string()];
            a.extend(["--endpoint".into(), endpoint.clone(), "--addr".into(), addr.to_string()]);
            a.extend(["--transport".into(), o.transport.clone(), "--steps".into(), o.steps.to_string()]);
            a.extend(["--decode-config".into(), o.decode_config.clone()]);
            a.extend(["--deadline-ms".into(), o.deadline_ms.to_string(), "--retry-ms".into(), o.retry_ms.to_string()]);
            a.extend(["--give-up-seconds".into(), o.give_up_seconds.to_string()]);
            a.extend(role_args(o));
            Proc::spawn(&a, Src::Decode(i), &tx)
        })
        .collect();
    drop(tx);
    let mut d = Driver {
        o: o.clone(),
        rx,
        prefill,
        prefill_ready: ready,
        states: (0..o.decodes).map(|_| DecodeState::default()).collect(),
        decodes,
        fault: Fault::default(),
        prefill_events: Vec::new(),
    };
    let end = d.run();
    if end.is_err() && d.fault.cont_at.is_some() {
        d.cont();
    }
    let summary = summarise(&d, &end);
    print_summary(&summary);
    if let Some(path) = &o.json {
        let text = serde_json::to_string(&summary).expect("json");
        std::fs::write(path, text + "\n").unwrap_or_else(|e| crate::die(&format!("{path}: {e}")));
    }
    // Children still running (an aborted run) are killed by their Drop.
    drop(d);
    std::process::exit(if summary["ok"] == true { 0 } else { 1 })
}
