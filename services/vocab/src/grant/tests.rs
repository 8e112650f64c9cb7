//! KAI's arithmetic held to figures KAI's own Go expressions printed.
//!
//! The expected values were computed (not written by hand) by a throwaway
//! Go program (go 1.26, linux/amd64) that copies KAI v0.17.0's expressions
//! verbatim: `getNodeGpuMemory` (scheduler/api/node_info/node_info.go),
//! `math.Ceil(float64(memory)/float64(MemoryOfEveryGpuOnNode)*100)/100`
//! (gpu_sharing_node_info.go), `fmt.Sprintf("%.2f", portion)`
//! (scheduler/cache/cache.go) and `calculateCudaDeviceMemoryLimit`
//! (binder/plugins/hamicore/hami_core.go), run over each label and
//! annotation below. The same program compared 302 600 random cases
//! (labels 1000-301000 MiB and odd ones, random `gpu-memory` and
//! `gpu-fraction` strings) with this module: no difference. It is not
//! kept in the repository.

use super::*;

/// An annotation: `gpu-memory` (MiB) or `gpu-fraction`.
#[derive(Clone, Copy, Debug)]
enum Asked {
    M(&'static str),
    F(&'static str),
}
use Asked::{F, M};

impl Asked {
    fn grant(self) -> Option<Grant> {
        match self {
            M(mib) => Grant::of(Some(mib), None),
            F(fraction) => Grant::of(None, Some(fraction)),
        }
    }
}

/// (label, annotation, portion in hundredths, KAI's limit in MiB) on
/// GPUs of 15 GiB to 141 GiB, labelled as GPU feature discovery labels
/// them (NVML's total in MiB).
const KAI_PRINTED: &[(&str, Asked, u32, u64)] = &[
    // T4
    ("15360", M("1024"), 7, 1075),
    ("15360", M("4096"), 27, 4147),
    ("15360", M("8192"), 54, 8294),
    ("15360", M("10000"), 66, 10137),
    ("15360", F("0.1"), 10, 1536),
    ("15360", F("0.125"), 12, 1843),
    ("15360", F("0.25"), 25, 3840),
    ("15360", F("0.333"), 33, 5068),
    ("15360", F("0.5"), 50, 7680),
    ("15360", F("0.75"), 75, 11520),
    // V100 16GB
    ("16384", M("1024"), 7, 1146),
    ("16384", M("4096"), 26, 4259),
    ("16384", M("8192"), 51, 8355),
    ("16384", M("10000"), 62, 10158),
    ("16384", F("0.1"), 10, 1638),
    ("16384", F("0.125"), 12, 1966),
    ("16384", F("0.25"), 25, 4096),
    ("16384", F("0.333"), 33, 5406),
    ("16384", F("0.5"), 50, 8192),
    ("16384", F("0.75"), 75, 12288),
    // A10
    ("23028", M("1024"), 5, 1151),
    ("23028", M("4096"), 18, 4145),
    ("23028", M("8192"), 36, 8290),
    ("23028", M("10000"), 44, 10132),
    ("23028", F("0.1"), 10, 2302),
    ("23028", F("0.125"), 12, 2763),
    ("23028", F("0.25"), 25, 5757),
    ("23028", F("0.333"), 33, 7599),
    ("23028", F("0.5"), 50, 11514),
    ("23028", F("0.75"), 75, 17271),
    // V100 32GB
    ("32768", M("1024"), 4, 1310),
    ("32768", M("4096"), 13, 4259),
    ("32768", M("8192"), 26, 8519),
    ("32768", M("10000"), 31, 10158),
    ("32768", F("0.1"), 10, 3276),
    ("32768", F("0.125"), 12, 3932),
    ("32768", F("0.25"), 25, 8192),
    ("32768", F("0.333"), 33, 10813),
    ("32768", F("0.5"), 50, 16384),
    ("32768", F("0.75"), 75, 24576),
    // A100 40GB
    ("40960", M("1024"), 3, 1228),
    ("40960", M("4096"), 11, 4505),
    ("40960", M("8192"), 21, 8601),
    ("40960", M("10000"), 25, 10240),
    ("40960", F("0.1"), 10, 4096),
    ("40960", F("0.125"), 12, 4915),
    ("40960", F("0.25"), 25, 10240),
    ("40960", F("0.333"), 33, 13516),
    ("40960", F("0.5"), 50, 20480),
    ("40960", F("0.75"), 75, 30720),
    // L40S
    ("46068", M("1024"), 3, 1382),
    ("46068", M("4096"), 9, 4146),
    ("46068", M("8192"), 18, 8292),
    ("46068", M("10000"), 22, 10134),
    ("46068", F("0.1"), 10, 4606),
    ("46068", F("0.125"), 12, 5528),
    ("46068", F("0.25"), 25, 11517),
    ("46068", F("0.333"), 33, 15202),
    ("46068", F("0.5"), 50, 23034),
    ("46068", F("0.75"), 75, 34551),
    // H100 80GB
    ("81559", M("1024"), 2, 1631),
    ("81559", M("4096"), 6, 4893),
    ("81559", M("8192"), 11, 8971),
    ("81559", M("10000"), 13, 10602),
    ("81559", F("0.1"), 10, 8155),
    ("81559", F("0.125"), 12, 9787),
    ("81559", F("0.25"), 25, 20389),
    ("81559", F("0.333"), 33, 26914),
    ("81559", F("0.5"), 50, 40779),
    ("81559", F("0.75"), 75, 61169),
    // A100 80GB
    ("81920", M("1024"), 2, 1638),
    ("81920", M("4096"), 6, 4915),
    ("81920", M("8192"), 11, 9011),
    ("81920", M("10000"), 13, 10649),
    ("81920", F("0.1"), 10, 8192),
    ("81920", F("0.125"), 12, 9830),
    ("81920", F("0.25"), 25, 20480),
    ("81920", F("0.333"), 33, 27033),
    ("81920", F("0.5"), 50, 40960),
    ("81920", F("0.75"), 75, 61440),
    // H100 NVL
    ("95830", M("1024"), 2, 1916),
    ("95830", M("4096"), 5, 4791),
    ("95830", M("8192"), 9, 8624),
    ("95830", M("10000"), 11, 10541),
    ("95830", F("0.1"), 10, 9583),
    ("95830", F("0.125"), 12, 11499),
    ("95830", F("0.25"), 25, 23957),
    ("95830", F("0.333"), 33, 31623),
    ("95830", F("0.5"), 50, 47915),
    ("95830", F("0.75"), 75, 71872),
    // H200
    ("143771", M("1024"), 1, 1437),
    ("143771", M("4096"), 3, 4313),
    ("143771", M("8192"), 6, 8626),
    ("143771", M("10000"), 7, 10063),
    ("143771", F("0.1"), 10, 14377),
    ("143771", F("0.125"), 12, 17252),
    ("143771", F("0.25"), 25, 35942),
    ("143771", F("0.333"), 33, 47444),
    ("143771", F("0.5"), 50, 71885),
    ("143771", F("0.75"), 75, 107828),
];

#[test]
fn kai_limits_on_gpus_of_15_to_141_gib_are_kais_to_the_mib() {
    for &(label, asked, hundredths, mib) in KAI_PRINTED {
        let grant = asked.grant().expect("a grant");
        assert_eq!(
            grant.portion_hundredths(label),
            Some(hundredths),
            "{asked:?} on {label}"
        );
        assert_eq!(
            grant.kai_limit_mib(label),
            Some(mib),
            "{asked:?} on {label}"
        );
    }
}

#[test]
fn kais_documented_example_a_t4_gives_gpu_memory_4096_a_4147m_limit() {
    // docs/gpu-sharing/hami/README.md of KAI v0.17.0: "requesting 4096 MiB
    // on a 15360 MiB GPU (T4) rounds to a 0.27 fraction, yielding 4147m".
    let grant = Grant::of(Some("4096"), None).expect("a grant");
    assert_eq!(grant.portion_hundredths("15360"), Some(27));
    assert_eq!(grant.kai_limit_mib("15360"), Some(4147));
}

#[test]
fn the_scheduler_floors_the_label_and_the_binder_does_not() {
    // 4096 of 15300 (the floored label) is 0.2677, ceiled to 0.27; the
    // binder multiplies the label as written: 15360 × 0.27.
    let grant = Grant::MemoryMib(4096);
    assert_eq!(grant.kai_limit_mib("15360"), Some(4147));
    assert_eq!(grant.kai_limit_mib("15300"), Some(4131));
    // 1071 / 15300 is 0.07 on paper; in doubles ×100 it is just above 7,
    // so KAI's ceiling makes it 0.08 (the Go program printed 1228m).
    assert_eq!(grant.portion_hundredths("15360"), Some(27));
    assert_eq!(Grant::MemoryMib(1071).portion_hundredths("15360"), Some(8));
    assert_eq!(Grant::MemoryMib(1071).kai_limit_mib("15360"), Some(1228));
    // 1 MiB asked is 0.01 of the GPU: 153 MiB on a T4.
    assert_eq!(Grant::MemoryMib(1).kai_limit_mib("15360"), Some(153));
    // A whole GPU asked in MiB.
    assert_eq!(Grant::MemoryMib(15300).kai_limit_mib("15360"), Some(15360));
}

#[test]
fn fractions_are_printed_with_two_decimals_ties_to_even() {
    // %.2f of the double: 0.125 and 0.625 are exact binary ties and go to
    // the even digit; 0.375 and 0.875 too (up); 0.335 is a little above.
    for (fraction, hundredths) in [
        ("0.125", 12),
        ("0.375", 38),
        ("0.625", 62),
        ("0.875", 88),
        ("0.335", 34),
        ("0.114999999", 11),
        ("0.005", 1),
        ("0.015", 1),
        ("1e-1", 10),
        ("5E-1", 50),
        (".5", 50),
        ("+0.5", 50),
        ("1", 100),
    ] {
        assert_eq!(
            Grant::of(None, Some(fraction)),
            Some(Grant::FractionHundredths(hundredths)),
            "{fraction}"
        );
    }
    // The Go program: 0.125 of a T4 is 1843m, 0.114999999 of 144384 is 15882m.
    assert_eq!(
        Grant::FractionHundredths(12).kai_limit_mib("15360"),
        Some(1843)
    );
    assert_eq!(
        Grant::of(None, Some("0.114999999")).and_then(|g| g.kai_limit_mib("144384")),
        Some(15882)
    );
    assert_eq!(
        Grant::FractionHundredths(100).kai_limit_mib("144384"),
        Some(144_384)
    );
}

#[test]
fn annotations_are_read_as_kais_scheduler_reads_them() {
    assert_eq!(Grant::of(Some("4096"), None), Some(Grant::MemoryMib(4096)));
    assert_eq!(Grant::of(Some("+4096"), None), Some(Grant::MemoryMib(4096)));
    assert_eq!(
        Grant::of(None, Some("0.5")),
        Some(Grant::FractionHundredths(50))
    );
    // Both (KAI's admission refuses it): the scheduler's valid fraction wins.
    assert_eq!(
        Grant::of(Some("2048"), Some("0.5")),
        Some(Grant::FractionHundredths(50))
    );
    assert_eq!(
        Grant::of(Some("2048"), Some("1.5")),
        Some(Grant::MemoryMib(2048))
    );
    // KAI does not trim: " 4096" is no gpu-memory to it.
    assert_eq!(Grant::of(Some(" 4096"), None), None);
    assert_eq!(Grant::of(None, Some("0.5 ")), None);
    for memory in ["0", "-5", "lots", "4096Mi", "1.5", ""] {
        assert_eq!(Grant::of(Some(memory), None), None, "{memory}");
    }
    for fraction in ["0", "-0.5", "1.5", "NaN", "inf", "0x1p-1", "half", ""] {
        assert_eq!(Grant::of(None, Some(fraction)), None, "{fraction}");
    }
    // Printed as 0.00: the binder writes no limit, nothing is granted.
    assert_eq!(Grant::of(None, Some("0.004")), None);
    assert_eq!(Grant::of(None, None), None);
}

#[test]
fn where_kais_binder_writes_nothing() {
    let memory = Grant::MemoryMib(4096);
    let half = Grant::FractionHundredths(50);
    // No label, or one KAI cannot parse as a positive integer (KAI #1967:
    // GB10 nodes have none): no limit, the pod runs uncapped by KAI.
    for label in [
        "", "abc", " 15360", "15360 ", "15360Mi", "15.5", "0", "-1", "-15360",
    ] {
        assert_eq!(memory.kai_limit_mib(label), None, "{label:?}");
        assert_eq!(half.kai_limit_mib(label), None, "{label:?}");
    }
    // Below 100 MiB the scheduler's floor is 0: it places no gpu-memory
    // pod (an infinite portion), while a fraction still gets its share.
    assert_eq!(memory.portion_hundredths("99"), None);
    assert_eq!(memory.kai_limit_mib("99"), None);
    assert_eq!(half.kai_limit_mib("99"), Some(49));
    // A portion times the label under 1 MiB truncates to zero: nothing.
    assert_eq!(Grant::FractionHundredths(1).kai_limit_mib("99"), None);
    // Go's ParseInt takes a sign and leading zeros, as Rust's does.
    assert_eq!(memory.kai_limit_mib("+15360"), Some(4147));
    assert_eq!(memory.kai_limit_mib("015360"), Some(4147));
}

#[test]
fn a_label_in_bytes_is_converted_by_the_scheduler_only() {
    // gpu-feature-discovery issue 26: 15 GiB written in bytes. The
    // scheduler divides it by 2^20 (15360, floored 15300); the binder
    // multiplies the bytes: the Go program printed 8053063680m for 0.5,
    // a limit 2^20 times the share, which caps nothing.
    let label = "16106127360";
    assert_eq!(Grant::MemoryMib(4096).portion_hundredths(label), Some(27));
    assert_eq!(
        Grant::FractionHundredths(50).kai_limit_mib(label),
        Some(8_053_063_680)
    );
    // At 2^63 MiB and more the Go conversion overflows (amd64) and the
    // binder writes nothing.
    assert_eq!(
        Grant::FractionHundredths(100).kai_limit_mib("9223372036854775807"),
        None
    );
}
