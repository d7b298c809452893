//! The QEMU command line of a guest run: a q35 machine with Intel's vIOMMU in caching mode (so every DMA map of
//! the guest reaches the device model), the guest's RAM as a memory backend QEMU can share with the device model
//! (or not), the serial console, and each emulated function as a `vfio-user-pci` device on its UNIX socket.

use std::path::PathBuf;

/// Where the guest's console goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Console {
    /// QEMU's stdin and stdout (the host reads it and answers on it).
    Stdio,
    /// The user's terminal: QEMU owns it (raw mode), Ctrl-C goes to the guest, the monitor shares it (Ctrl-A C),
    /// and the console is copied to `log`.
    Terminal { log: PathBuf },
}

/// One `vfio-user-pci` device: its QEMU id and the device model's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioUser {
    pub id: String,
    pub socket: PathBuf,
    /// Behind a `pcie-root-port` of this chassis number, so QMP `device_del`/`device_add` work on it.
    pub root_port: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub qemu: PathBuf,
    pub accel: String,
    pub memory: String,
    /// `-cpu` under TCG (None: QEMU's default; under KVM the host's CPU).
    pub cpu: Option<String>,
    pub smp: u8,
    /// Guest RAM in a shared memfd (QEMU passes its fd to the device model); otherwise private RAM, so the
    /// device model must use DMA_READ/DMA_WRITE messages.
    pub share: bool,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub append: String,
    pub console: Console,
    /// A guest reboot ends QEMU (`-no-reboot`).
    pub no_reboot: bool,
    /// `vfio-user-pci.x-reply-poll-us` (qemu-patches/0005).
    pub reply_poll_us: Option<u64>,
    pub devices: Vec<VfioUser>,
    /// QEMU's `edu` device (the benchmark's baseline).
    pub edu: bool,
    pub extra: Vec<String>,
    /// A second serial port connected, as a client, to this UNIX socket (hfi1-user-host).
    pub second_serial: Option<PathBuf>,
    pub pidfile: Option<PathBuf>,
}

/// A `-device` argument in QEMU's JSON syntax (docs/system/invocation: `-device '{"driver":...}'`), which keeps
/// socket paths free of QEMU's comma escaping.
fn vfio_user_json(dev: &VfioUser) -> String {
    let mut obj = serde_json::Map::new();
    obj.insert("driver".into(), "vfio-user-pci".into());
    obj.insert("id".into(), dev.id.clone().into());
    if dev.root_port.is_some() {
        obj.insert("bus".into(), format!("rp-{}", dev.id).into());
    }
    obj.insert("socket".into(), serde_json::json!({"path": dev.socket.to_string_lossy(), "type": "unix"}));
    serde_json::Value::Object(obj).to_string()
}

impl Machine {
    /// The arguments after the QEMU binary.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["-accel".into(), self.accel.clone()];
        match (self.accel.as_str(), &self.cpu) {
            ("kvm", _) => a.extend(["-cpu".into(), "host".into()]),
            (_, Some(cpu)) => a.extend(["-cpu".into(), cpu.clone()]),
            _ => {}
        }
        if self.smp > 1 {
            a.extend(["-smp".into(), self.smp.to_string()]);
        }
        a.extend(["-machine".into(), "q35,memory-backend=mem".into(), "-m".into(), self.memory.clone()]);
        let backend = if self.share {
            format!("memory-backend-memfd,id=mem,size={},share=on", self.memory)
        } else {
            format!("memory-backend-ram,id=mem,size={},share=off", self.memory)
        };
        a.extend(["-object".into(), backend]);
        a.extend(["-device".into(), "intel-iommu,caching-mode=on".into()]);
        a.extend(["-kernel".into(), self.kernel.display().to_string()]);
        a.extend(["-initrd".into(), self.initrd.display().to_string()]);
        a.extend(["-append".into(), self.append.clone(), "-nodefaults".into(), "-display".into(), "none".into()]);
        match &self.console {
            Console::Stdio => a.extend(["-serial".into(), "stdio".into()]),
            Console::Terminal { log } => a.extend([
                "-chardev".into(),
                format!("stdio,id=console,mux=on,signal=off,logfile={}", log.display()),
                "-serial".into(),
                "chardev:console".into(),
                "-mon".into(),
                "chardev=console,mode=readline".into(),
            ]),
        }
        if self.no_reboot {
            a.push("-no-reboot".into());
        }
        if let Some(us) = self.reply_poll_us {
            a.extend(["-global".into(), format!("vfio-user-pci.x-reply-poll-us={us}")]);
        }
        for dev in &self.devices {
            if let Some(chassis) = dev.root_port {
                a.extend(["-device".into(), format!("pcie-root-port,id=rp-{},chassis={chassis}", dev.id)]);
            }
            a.extend(["-device".into(), vfio_user_json(dev)]);
        }
        if self.edu {
            a.extend(["-device".into(), "edu".into()]);
        }
        a.extend(self.extra.iter().cloned());
        if let Some(sock) = &self.second_serial {
            a.extend([
                "-chardev".into(),
                format!("socket,id=hfi1user,path={},server=off", sock.display()),
                "-serial".into(),
                "chardev:hfi1user".into(),
            ]);
        }
        if let Some(p) = &self.pidfile {
            a.extend(["-pidfile".into(), p.display().to_string()]);
        }
        a
    }

    /// The command as a shell would take it, for the logs (qemu-command.txt).
    pub fn shell_line(&self) -> String {
        std::iter::once(self.qemu.display().to_string())
            .chain(self.args())
            .map(|w| shell_quote(&w))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `w` quoted for a POSIX shell where it needs it.
pub fn shell_quote(w: &str) -> String {
    if !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)) {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            qemu: "/q/qemu-system-x86_64".into(),
            accel: "tcg".into(),
            memory: "512M".into(),
            cpu: None,
            smp: 1,
            share: true,
            kernel: "/g/vmlinuz".into(),
            initrd: "/g/initrd".into(),
            append: "console=ttyS0 quiet".into(),
            console: Console::Stdio,
            no_reboot: true,
            reply_poll_us: None,
            devices: vec![],
            edu: false,
            extra: vec![],
            second_serial: None,
            pidfile: None,
        }
    }

    /// The value after each occurrence of `opt`.
    fn values<'a>(args: &'a [String], opt: &str) -> Vec<&'a str> {
        args.windows(2).filter(|w| w[0] == opt).map(|w| w[1].as_str()).collect()
    }

    #[test]
    fn shared_guest_ram_is_a_memfd_backend_and_private_ram_a_ram_backend_both_the_machines_memory() {
        let cases: &[(bool, &str)] = &[
            (true, "memory-backend-memfd,id=mem,size=512M,share=on"),
            (false, "memory-backend-ram,id=mem,size=512M,share=off"),
        ];
        for (share, backend) in cases {
            let args = Machine { share: *share, ..machine() }.args();
            assert_eq!(values(&args, "-object"), [*backend]);
            assert_eq!(values(&args, "-machine"), ["q35,memory-backend=mem"]);
            assert_eq!(values(&args, "-m"), ["512M"]);
        }
    }

    #[test]
    fn kvm_takes_the_host_cpu_and_tcg_the_rows_cpu_or_the_default_one() {
        let cases: &[(&str, Option<&str>, &[&str])] = &[
            ("kvm", None, &["host"]),
            ("kvm", Some("max"), &["host"]),
            ("tcg", None, &[]),
            ("tcg", Some("max"), &["max"]),
        ];
        for (accel, row_cpu, cpu) in cases {
            let args = Machine { accel: accel.to_string(), cpu: row_cpu.map(String::from), ..machine() }.args();
            assert_eq!(values(&args, "-accel"), [*accel]);
            assert_eq!(values(&args, "-cpu"), *cpu, "{accel} {row_cpu:?}");
        }
    }

    #[test]
    fn one_vcpu_is_qemus_default_and_more_go_as_smp() {
        let cases: &[(u8, &[&str])] = &[(1, &[]), (2, &["2"])];
        for (smp, want) in cases {
            assert_eq!(values(&Machine { smp: *smp, ..machine() }.args(), "-smp"), *want);
        }
    }

    #[test]
    fn the_viommu_is_in_caching_mode_and_the_guest_boots_the_given_kernel_with_its_parameters() {
        let args = machine().args();
        assert!(values(&args, "-device").contains(&"intel-iommu,caching-mode=on"));
        assert_eq!(values(&args, "-kernel"), ["/g/vmlinuz"]);
        assert_eq!(values(&args, "-initrd"), ["/g/initrd"]);
        assert_eq!(values(&args, "-append"), ["console=ttyS0 quiet"]);
        assert!(args.iter().any(|a| a == "-nodefaults"));
        assert!(args.iter().any(|a| a == "-no-reboot"));
        assert!(!Machine { no_reboot: false, ..machine() }.args().iter().any(|a| a == "-no-reboot"));
    }

    #[test]
    fn the_console_is_stdio_or_a_muxed_terminal_chardev_logged_to_a_file_with_signals_off() {
        let args = machine().args();
        assert_eq!(values(&args, "-serial"), ["stdio"]);
        assert!(values(&args, "-chardev").is_empty());
        let term = Machine { console: Console::Terminal { log: "/l/serial.log".into() }, ..machine() }.args();
        assert_eq!(values(&term, "-chardev"), ["stdio,id=console,mux=on,signal=off,logfile=/l/serial.log"]);
        assert_eq!(values(&term, "-serial"), ["chardev:console"]);
        assert_eq!(values(&term, "-mon"), ["chardev=console,mode=readline"]);
    }

    #[test]
    fn each_function_is_a_vfio_user_pci_device_on_its_unix_socket_and_a_hotpluggable_one_has_its_root_port() {
        let m = Machine {
            devices: vec![
                VfioUser { id: "hfi1".into(), socket: "/s/hfi1.sock".into(), root_port: Some(1) },
                VfioUser { id: "hfi1-wfr".into(), socket: "/s/hfi1-wfr.sock".into(), root_port: None },
            ],
            edu: true,
            ..machine()
        };
        let devices = values(&m.args(), "-device").into_iter().map(String::from).collect::<Vec<_>>();
        assert_eq!(devices[0], "intel-iommu,caching-mode=on");
        assert_eq!(devices[1], "pcie-root-port,id=rp-hfi1,chassis=1");
        let hfi1: serde_json::Value = serde_json::from_str(&devices[2]).unwrap();
        assert_eq!(
            hfi1,
            serde_json::json!({"driver": "vfio-user-pci", "id": "hfi1", "bus": "rp-hfi1",
                "socket": {"path": "/s/hfi1.sock", "type": "unix"}})
        );
        let wfr: serde_json::Value = serde_json::from_str(&devices[3]).unwrap();
        assert_eq!(
            wfr,
            serde_json::json!({"driver": "vfio-user-pci", "id": "hfi1-wfr",
                "socket": {"path": "/s/hfi1-wfr.sock", "type": "unix"}})
        );
        assert_eq!(devices[4], "edu");
    }

    #[test]
    fn the_reply_poll_is_a_global_property_of_vfio_user_pci_and_the_second_serial_a_socket_client() {
        let m = Machine {
            reply_poll_us: Some(50),
            second_serial: Some("/l/hfi1-user.sock".into()),
            extra: vec!["-s".into()],
            pidfile: Some("/l/qemu.pid".into()),
            ..machine()
        };
        let args = m.args();
        assert_eq!(values(&args, "-global"), ["vfio-user-pci.x-reply-poll-us=50"]);
        assert_eq!(values(&args, "-chardev"), ["socket,id=hfi1user,path=/l/hfi1-user.sock,server=off"]);
        // ttyS0 is the console, ttyS1 the host side's port: the order of -serial gives the port numbers.
        assert_eq!(values(&args, "-serial"), ["stdio", "chardev:hfi1user"]);
        assert_eq!(values(&args, "-pidfile"), ["/l/qemu.pid"]);
        assert!(args.iter().any(|a| a == "-s"));
    }

    #[test]
    fn the_logged_command_line_quotes_what_a_shell_would_split() {
        let cases: &[(&str, &str)] =
            &[("-m", "-m"), ("a b", "'a b'"), ("{\"x\":1}", "'{\"x\":1}'"), ("it's", r"'it'\''s'"), ("", "''")];
        for (w, want) in cases {
            assert_eq!(shell_quote(w), *want);
        }
    }
}
