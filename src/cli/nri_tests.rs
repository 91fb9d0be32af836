//! `devgate nri`: its log filter and its flags.

mod log_filter_tests {
    use super::super::*;

    #[test]
    fn filters_by_level_and_target() {
        let cases: [(Option<&str>, &str, LevelFilter); 4] = [
            (None, "devgate::ledger", LevelFilter::INFO),
            (Some("warn"), "devgate::ledger", LevelFilter::WARN),
            (
                Some("info,devgate::ledger=debug"),
                "devgate::ledger",
                LevelFilter::DEBUG,
            ),
            (
                Some("info,devgate::ledger=debug"),
                "devgate::plugin",
                LevelFilter::INFO,
            ),
        ];
        for (value, target, want) in cases {
            let filter = log_filter(value.map(String::from)).unwrap();
            let level = want.into_level().unwrap();
            assert!(filter.would_enable(target, &level), "{value:?} {target}");
            if let Some(finer) = [tracing::Level::DEBUG, tracing::Level::TRACE]
                .into_iter()
                .find(|l| LevelFilter::from_level(*l) > want)
            {
                assert!(!filter.would_enable(target, &finer), "{value:?} {target}");
            }
        }
    }

    #[test]
    fn a_bad_filter_is_an_error_naming_it() {
        let err = log_filter(Some("info,x=loud".to_string())).unwrap_err();
        assert!(err.to_string().contains("info,x=loud"), "{err}");
    }
}

mod flag_tests {
    use std::path::Path;

    use clap::Parser;

    use super::super::NriArgs;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nri: NriArgs,
    }

    /// The defaults install scripts and the DaemonSet rely on, and every flag
    /// overriding its own.
    #[test]
    fn defaults_and_overrides() {
        let d = Flags::try_parse_from(["devgate-nri"]).unwrap().nri;
        assert_eq!(d.socket, Path::new("/var/run/nri/nri.sock"));
        assert_eq!((d.name.as_str(), d.idx.as_str()), ("devgate", "10"));
        assert_eq!(d.config, Path::new("/etc/devgate/config.toml"));
        assert_eq!(d.host_root, Path::new("/"));
        assert_eq!(d.state_dir, Path::new("/run/devgate"));
        let o = Flags::try_parse_from([
            "devgate-nri",
            "--socket=/s",
            "--name=n",
            "--idx=42",
            "--config=/c",
            "--host-root=/h",
            "--state-dir=/d",
        ])
        .unwrap()
        .nri;
        assert_eq!(
            (o.socket, o.name, o.idx, o.config, o.host_root, o.state_dir),
            (
                "/s".into(),
                "n".into(),
                "42".into(),
                "/c".into(),
                "/h".into(),
                "/d".into()
            )
        );
    }

    /// The hook runs in the bundle directory: the state directory it is
    /// given must not depend on the working directory.
    #[test]
    fn a_relative_state_dir_is_made_absolute() {
        let a = Flags::try_parse_from(["devgate-nri", "--state-dir=run/devgate"])
            .unwrap()
            .nri;
        let o = super::super::plugin_options(&a, false);
        assert!(o.state_dir.is_absolute(), "{:?}", o.state_dir);
        assert!(o.state_dir.ends_with("run/devgate"));
    }
}
