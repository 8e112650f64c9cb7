//! The TLS flags of every service, as one group each flattens into its
//! command line (`#[command(flatten)] tls: TlsArgs<Names>`).
//!
//! The services' flags predate the group and the chart and docs pass them
//! by name (`--tls-cert-file`, `--grpc-tls-cert-file`, `--agent-tls-ca-file`
//! …), so the group is one parser and one set of fields with the names
//! supplied per service ([`TlsFlagNames`]); clap's derive cannot rename a
//! flattened group, hence the hand-written `clap::Args`.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Arg, ArgMatches, Command, FromArgMatches};

/// One flag: `--long`, its environment variable, its help, its default.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub long: &'static str,
    pub env: &'static str,
    pub help: &'static str,
    pub default: Option<&'static str>,
}

/// The flags one service offers; `None` = not offered.
#[derive(Clone, Copy, Debug)]
pub struct TlsFlags {
    /// PEM certificate chain (ours: served, or presented to peers).
    pub cert: Flag,
    /// PEM private key of `cert`.
    pub key: Flag,
    /// PEM CA bundle: for a server, the CA client certificates must come
    /// from (mutual TLS); for a client ([`TlsFlags::client`]), the CA of the
    /// peers, which turns TLS on.
    pub ca: Option<Flag>,
    /// Seconds between certificate re-reads when no file event arrives.
    pub reload_fallback_seconds: Option<Flag>,
    /// Name verified in the peers' certificates (clients).
    pub server_name: Option<Flag>,
    /// A client: the certificate is optional and needs the CA.
    pub client: bool,
}

/// A service's names for the group.
pub trait TlsFlagNames {
    const FLAGS: TlsFlags;
}

/// Re-read period when a service offers no flag for it.
pub const DEFAULT_RELOAD_FALLBACK: Duration = Duration::from_secs(60);

/// The parsed group.
#[derive(Debug)]
pub struct TlsArgs<N> {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub reload_fallback: Duration,
    pub server_name: Option<String>,
    names: PhantomData<fn() -> N>,
}

impl<N> Clone for TlsArgs<N> {
    fn clone(&self) -> Self {
        Self {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            ca_file: self.ca_file.clone(),
            reload_fallback: self.reload_fallback,
            server_name: self.server_name.clone(),
            names: PhantomData,
        }
    }
}

impl<N> TlsArgs<N> {
    /// Certificate and key, when both are given (clap requires the pair).
    pub fn cert_and_key(&self) -> Option<(&Path, &Path)> {
        Some((self.cert_file.as_deref()?, self.key_file.as_deref()?))
    }
}

fn arg(flag: Flag) -> Arg {
    let arg = Arg::new(flag.long)
        .long(flag.long)
        .env(flag.env)
        // What clap's derive shows for these flags' fields.
        .value_name(flag.env)
        .help(flag.help);
    match flag.default {
        Some(default) => arg.default_value(default),
        None => arg,
    }
}

fn path(flag: Flag) -> Arg {
    arg(flag).value_parser(clap::value_parser!(PathBuf))
}

impl<N: TlsFlagNames> clap::Args for TlsArgs<N> {
    fn augment_args(cmd: Command) -> Command {
        let f = N::FLAGS;
        // A pair without defaults must be given whole; with defaults (the
        // webhook's mounted Secret), either may be overridden alone.
        let (mut cert, mut key) = (path(f.cert), path(f.key));
        if f.cert.default.is_none() && f.key.default.is_none() {
            cert = cert.requires(f.key.long);
            key = key.requires(f.cert.long);
        }
        let mut cmd = cmd;
        if let Some(ca) = f.ca {
            let mut ca_arg = path(ca);
            if f.client {
                cert = cert.requires(ca.long);
            } else {
                ca_arg = ca_arg.requires(f.cert.long);
            }
            cmd = cmd.arg(ca_arg);
        }
        cmd = cmd.arg(cert).arg(key);
        if let Some(reload) = f.reload_fallback_seconds {
            cmd = cmd.arg(arg(reload).value_parser(clap::value_parser!(u64)));
        }
        if let Some(name) = f.server_name {
            cmd = cmd.arg(arg(name));
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<N: TlsFlagNames> FromArgMatches for TlsArgs<N> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let f = N::FLAGS;
        let path =
            |flag: Option<Flag>| flag.and_then(|flag| m.get_one::<PathBuf>(flag.long).cloned());
        Ok(Self {
            cert_file: path(Some(f.cert)),
            key_file: path(Some(f.key)),
            ca_file: path(f.ca),
            // At least a second: a zero period would spin.
            reload_fallback: f
                .reload_fallback_seconds
                .and_then(|flag| m.get_one::<u64>(flag.long).copied())
                .map_or(DEFAULT_RELOAD_FALLBACK, |s| Duration::from_secs(s.max(1))),
            server_name: f
                .server_name
                .and_then(|flag| m.get_one::<String>(flag.long).cloned()),
            names: PhantomData,
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    struct Server;
    impl TlsFlagNames for Server {
        const FLAGS: TlsFlags = TlsFlags {
            cert: Flag {
                long: "grpc-tls-cert-file",
                env: "TEST_GRPC_TLS_CERT_FILE",
                help: "cert",
                default: None,
            },
            key: Flag {
                long: "grpc-tls-key-file",
                env: "TEST_GRPC_TLS_KEY_FILE",
                help: "key",
                default: None,
            },
            ca: Some(Flag {
                long: "grpc-tls-client-ca-file",
                env: "TEST_GRPC_TLS_CLIENT_CA_FILE",
                help: "client CA",
                default: None,
            }),
            reload_fallback_seconds: Some(Flag {
                long: "tls-reload-fallback-seconds",
                env: "TEST_TLS_RELOAD_FALLBACK_SECONDS",
                help: "reload",
                default: Some("60"),
            }),
            server_name: None,
            client: false,
        };
    }

    struct Client;
    impl TlsFlagNames for Client {
        const FLAGS: TlsFlags = TlsFlags {
            cert: Flag {
                long: "agent-tls-cert-file",
                env: "TEST_AGENT_TLS_CERT_FILE",
                help: "cert",
                default: None,
            },
            key: Flag {
                long: "agent-tls-key-file",
                env: "TEST_AGENT_TLS_KEY_FILE",
                help: "key",
                default: None,
            },
            ca: Some(Flag {
                long: "agent-tls-ca-file",
                env: "TEST_AGENT_TLS_CA_FILE",
                help: "CA",
                default: None,
            }),
            reload_fallback_seconds: None,
            server_name: Some(Flag {
                long: "agent-tls-server-name",
                env: "TEST_AGENT_TLS_SERVER_NAME",
                help: "name",
                default: Some("kai-node-agent"),
            }),
            client: true,
        };
    }

    #[derive(clap::Parser)]
    struct ServerCli {
        #[command(flatten)]
        tls: TlsArgs<Server>,
    }

    #[derive(clap::Parser)]
    struct ClientCli {
        #[command(flatten)]
        tls: TlsArgs<Client>,
    }

    #[test]
    fn a_server_group_parses_under_its_own_names() {
        let cli = ServerCli::try_parse_from([
            "x",
            "--grpc-tls-cert-file=/c",
            "--grpc-tls-key-file=/k",
            "--grpc-tls-client-ca-file=/ca",
            "--tls-reload-fallback-seconds=0",
        ])
        .expect("parses");
        assert_eq!(
            cli.tls.cert_and_key(),
            Some((Path::new("/c"), Path::new("/k")))
        );
        assert_eq!(cli.tls.ca_file.as_deref(), Some(Path::new("/ca")));
        assert_eq!(cli.tls.reload_fallback, Duration::from_secs(1));
        let none = ServerCli::try_parse_from(["x"]).expect("TLS is optional");
        assert_eq!(none.tls.cert_and_key(), None);
        assert_eq!(none.tls.reload_fallback, DEFAULT_RELOAD_FALLBACK);
        for half in [
            &["x", "--grpc-tls-cert-file=/c"][..],
            &["x", "--grpc-tls-key-file=/k"],
            &["x", "--grpc-tls-client-ca-file=/ca"],
        ] {
            assert!(ServerCli::try_parse_from(half).is_err(), "{half:?}");
        }
    }

    #[test]
    fn a_client_certificate_needs_the_peers_ca() {
        let cli = ClientCli::try_parse_from(["x", "--agent-tls-ca-file=/ca"]).expect("parses");
        assert_eq!(cli.tls.server_name.as_deref(), Some("kai-node-agent"));
        assert_eq!(cli.tls.cert_and_key(), None);
        assert!(
            ClientCli::try_parse_from(["x", "--agent-tls-cert-file=/c", "--agent-tls-key-file=/k"])
                .is_err()
        );
    }
}
