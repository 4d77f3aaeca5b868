//! How a run's clients reached the system: over TLS or in plaintext.

/// Whether the benchmark's clients spoke TLS to the system: the same system is
/// measured both ways to show what TLS costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    Tls,
    /// Also what a JSON line written before this field existed means: every system
    /// was measured in plaintext then.
    #[default]
    Plaintext,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tls => "TLS",
            Transport::Plaintext => "plaintext",
        }
    }
}
