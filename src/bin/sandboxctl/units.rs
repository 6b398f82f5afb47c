//! Parsing of what people type on the command line: sizes (`512Mi`, `2G`), TTLs
//! and timeouts (`90`, `30s`, `5m`, `1h30m`, `none`), CPU amounts, `K=V` pairs,
//! `UID[:GID]`, `SRC:DST[:ro]` volumes and ids. Every parser returns a message meant for a person; clap
//! prints it as a usage error (exit 2), so nothing malformed reaches the daemon.

/// Bytes in one MiB, the unit of `memory_mib` and `disk_mib`.
const MIB: u128 = 1024 * 1024;

/// Most fractional digits a size may carry; more would only add noise, and the
/// bound keeps the fixed-point arithmetic below far from overflow.
const MAX_FRACTION_DIGITS: usize = 9;

/// Parses a size with an optional unit and returns it in MiB, rounded up so the
/// limit is never smaller than asked. `Ki Mi Gi Ti` are powers of 1024, `K M G T`
/// powers of 1000 (as Kubernetes reads them); a bare number is bytes. A trailing
/// `B` (`MiB`, `GB`) is accepted. Fractions (`1.5Gi`) are exact.
pub fn parse_size_mib(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() || num == "." {
        return Err(format!(
            "{s:?} is not a size: give a number with an optional unit, e.g. 512Mi, 2Gi or 1073741824"
        ));
    }
    let mult: u128 = match unit {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1_000,
        "Ki" | "KiB" => 1 << 10,
        "M" | "MB" => 1_000_000,
        "Mi" | "MiB" => 1 << 20,
        "G" | "GB" => 1_000_000_000,
        "Gi" | "GiB" => 1 << 30,
        "T" | "TB" => 1_000_000_000_000,
        "Ti" | "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?}: use Ki, Mi, Gi, Ti (powers of 1024), \
                 K, M, G, T (powers of 1000) or a plain number of bytes"
            ))
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.contains('.') {
        return Err(format!("{s:?} is not a size: more than one decimal point"));
    }
    if frac.len() > MAX_FRACTION_DIGITS {
        return Err(format!(
            "{s:?} has more than {MAX_FRACTION_DIGITS} digits after the decimal point"
        ));
    }
    let too_large = || format!("{s:?} is too large");
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_large())?
    };
    let frac_v: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| too_large())?
    };
    // Fixed point: value = (int * 10^n + frac) / 10^n, times the unit, rounded up.
    let scale = 10u128.pow(frac.len() as u32);
    let scaled = int_v
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac_v))
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(too_large)?;
    let bytes = scaled.div_ceil(scale);
    if bytes == 0 {
        return Err(format!("{s:?}: a size must be more than zero"));
    }
    u64::try_from(bytes.div_ceil(MIB)).map_err(|_| too_large())
}

/// Parses a duration in seconds: a bare number (`90`, `1.5`) or number+unit
/// pairs with units `s m h d` (`30s`, `5m`, `1h30m`).
pub fn parse_duration_secs(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let bad = || {
        format!("{s:?} is not a duration: give seconds (90), or a number with s, m, h or d (30s, 5m, 1h30m)")
    };
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(v) = t.parse::<f64>() {
        // `parse::<f64>` also takes "inf", "NaN" and "1e3"; only plain decimals count.
        if t.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Ok(v);
        }
        return Err(bad());
    }
    let mut total = 0.0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(split);
        if num.is_empty() || num.matches('.').count() > 1 || num == "." {
            return Err(bad());
        }
        let v: f64 = num.parse().map_err(|_| bad())?;
        let mut chars = tail.chars();
        let factor = match chars.next() {
            Some('s') => 1.0,
            Some('m') => 60.0,
            Some('h') => 3600.0,
            Some('d') => 86400.0,
            _ => return Err(bad()),
        };
        total += v * factor;
        rest = chars.as_str();
    }
    if !total.is_finite() {
        return Err(bad());
    }
    Ok(total)
}

/// Parses a TTL: a duration (rounded up to whole seconds) or `none`/`-1` for no
/// TTL. Zero is refused: it would remove the sandbox the moment it is ready.
pub fn parse_ttl(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("never") || t == "-1" {
        return Ok(-1);
    }
    let secs = parse_duration_secs(t).map_err(|e| format!("{e}, or none for no TTL"))?;
    if secs <= 0.0 {
        return Err(format!(
            "{s:?}: a TTL must be more than zero seconds (or none for no TTL)"
        ));
    }
    let whole = secs.ceil();
    if whole > i64::MAX as f64 {
        return Err(format!("{s:?} is too large for a TTL"));
    }
    Ok(whole as i64)
}

/// Parses a process timeout in seconds (fractions allowed); must be positive.
pub fn parse_timeout(s: &str) -> Result<f64, String> {
    let secs = parse_duration_secs(s)?;
    if secs <= 0.0 {
        return Err(format!("{s:?}: a timeout must be more than zero seconds"));
    }
    Ok(secs)
}

/// Parses a CPU amount in cores (`1`, `0.5`) or millicores (`500m`).
pub fn parse_cpu(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a CPU amount: give cores (1, 0.5) or millicores (500m)");
    let (num, div) = match t.strip_suffix('m') {
        Some(n) => (n, 1000.0),
        None => (t, 1.0),
    };
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let cores = v / div;
    if !(cores.is_finite() && cores > 0.0) {
        return Err(format!("{s:?}: the CPU amount must be more than zero"));
    }
    Ok(cores)
}

/// Parses `KEY=VALUE` (the value may be empty or contain `=`).
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        Some(_) => Err(format!("{s:?}: the key before '=' must not be empty")),
        None => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// Parses `UID` or `UID:GID`, numeric only: names would have to be resolved
/// inside the sandbox's image, which the CLI cannot see.
pub fn parse_user(s: &str) -> Result<(u32, Option<u32>), String> {
    let bad = || format!("{s:?}: give a numeric UID or UID:GID (names are not resolved)");
    let (u, g) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let uid = u.parse::<u32>().map_err(|_| bad())?;
    let gid = g.map(|g| g.parse::<u32>().map_err(|_| bad())).transpose()?;
    Ok((uid, gid))
}

/// Checks a sandbox id before it goes into a URL path: an empty id would turn
/// `/v1/sandboxes/{id}` into the list route, and a `/` into another route.
pub fn parse_id(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the sandbox id must not be empty".into());
    }
    if s.contains('/') || s.chars().any(char::is_control) {
        return Err(format!("{s:?} is not a sandbox id"));
    }
    Ok(s.to_string())
}

/// Parses a volume as `docker run -v` spells one: `SRC:DST`, `SRC:DST:ro`
/// or `SRC:DST:rw`, both paths absolute (the daemon checks the rest).
pub fn parse_volume(s: &str) -> Result<sandboxd::model::HostVolume, String> {
    let usage = || format!("{s:?} is not a volume: give SRC:DST or SRC:DST:ro, absolute paths");
    let mut parts = s.split(':');
    let (Some(source), Some(destination)) = (parts.next(), parts.next()) else {
        return Err(usage());
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(_) => return Err(usage()),
    };
    if parts.next().is_some() || !source.starts_with('/') || !destination.starts_with('/') {
        return Err(usage());
    }
    Ok(sandboxd::model::HostVolume {
        source: source.into(),
        destination: destination.to_string(),
        read_only,
    })
}

/// Parses a file mode given in octal (`644`, `0755`, `0o600`).
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let t = s.trim_start_matches("0o");
    match u32::from_str_radix(t, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!(
            "{s:?} is not a file mode: give octal permission bits, e.g. 644 or 0755"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_binary_units() {
        assert_eq!(parse_size_mib("512Mi"), Ok(512));
        assert_eq!(parse_size_mib("512MiB"), Ok(512));
        assert_eq!(parse_size_mib("1Gi"), Ok(1024));
        assert_eq!(parse_size_mib("10Gi"), Ok(10240));
        assert_eq!(parse_size_mib("1Ti"), Ok(1024 * 1024));
        assert_eq!(parse_size_mib("1024Ki"), Ok(1));
        assert_eq!(parse_size_mib("1.5Gi"), Ok(1536));
        assert_eq!(parse_size_mib(" 2Gi "), Ok(2048));
    }

    #[test]
    fn sizes_in_decimal_units_round_up() {
        // 1 G = 10^9 bytes = 953.67 MiB.
        assert_eq!(parse_size_mib("1G"), Ok(954));
        assert_eq!(parse_size_mib("1GB"), Ok(954));
        assert_eq!(parse_size_mib("500M"), Ok(477));
        assert_eq!(parse_size_mib("1K"), Ok(1));
        assert_eq!(parse_size_mib("1k"), Ok(1));
    }

    #[test]
    fn sizes_in_plain_bytes_round_up() {
        assert_eq!(parse_size_mib("1048576"), Ok(1));
        assert_eq!(parse_size_mib("1048577"), Ok(2));
        assert_eq!(parse_size_mib("1"), Ok(1));
        assert_eq!(parse_size_mib("0.5"), Ok(1));
        assert_eq!(parse_size_mib("1073741824B"), Ok(1024));
    }

    #[test]
    fn garbage_sizes_are_refused_with_a_reason() {
        for bad in [
            "", " ", "Mi", "-1Gi", "abc", "1.2.3Gi", ".", "1e9", "1 Gi", "0", "0Mi", "0.0Gi",
        ] {
            assert!(parse_size_mib(bad).is_err(), "{bad:?} should be refused");
        }
        let err = parse_size_mib("512m").unwrap_err();
        assert!(err.contains("unknown size unit \"m\""), "{err}");
        assert!(err.contains("Mi"), "{err}");
        assert!(parse_size_mib("99999999999999999999999999999Ti")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size_mib("1.0000000001Gi").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("90"), Ok(90.0));
        assert_eq!(parse_duration_secs("1.5"), Ok(1.5));
        assert_eq!(parse_duration_secs("30s"), Ok(30.0));
        assert_eq!(parse_duration_secs("5m"), Ok(300.0));
        assert_eq!(parse_duration_secs("2h"), Ok(7200.0));
        assert_eq!(parse_duration_secs("1d"), Ok(86400.0));
        assert_eq!(parse_duration_secs("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration_secs("1m0.5s"), Ok(60.5));
        for bad in [
            "", "s", "5x", "5m3", "inf", "NaN", "1e3", "-5", "5 m", "..5s",
        ] {
            assert!(
                parse_duration_secs(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("120"), Ok(120));
        assert_eq!(parse_ttl("30s"), Ok(30));
        assert_eq!(parse_ttl("5m"), Ok(300));
        assert_eq!(parse_ttl("2h"), Ok(7200));
        assert_eq!(parse_ttl("none"), Ok(-1));
        assert_eq!(parse_ttl("NONE"), Ok(-1));
        assert_eq!(parse_ttl("-1"), Ok(-1));
        assert_eq!(parse_ttl("1.2"), Ok(2));
        assert!(parse_ttl("0").is_err());
        assert!(parse_ttl("-2").is_err());
        assert!(parse_ttl("soon").unwrap_err().contains("none"));
    }

    #[test]
    fn timeouts_and_cpu() {
        assert_eq!(parse_timeout("2.5"), Ok(2.5));
        assert_eq!(parse_timeout("1m"), Ok(60.0));
        assert!(parse_timeout("0").is_err());
        assert_eq!(parse_cpu("1"), Ok(1.0));
        assert_eq!(parse_cpu("0.5"), Ok(0.5));
        assert_eq!(parse_cpu("250m"), Ok(0.25));
        for bad in ["0", "-1", "", "m", "x", "inf", "0m"] {
            assert!(parse_cpu(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn pairs_users_ids_modes() {
        assert_eq!(parse_kv("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_kv("A="), Ok(("A".into(), String::new())));
        assert!(parse_kv("=x").is_err());
        assert!(parse_kv("A").is_err());
        assert_eq!(parse_user("1000"), Ok((1000, None)));
        assert_eq!(parse_user("1000:100"), Ok((1000, Some(100))));
        assert!(parse_user("root").is_err());
        assert!(parse_user("1000:").is_err());
        assert!(parse_user("-1").is_err());
        assert_eq!(parse_id("sb-1"), Ok("sb-1".into()));
        assert!(parse_id("").is_err());
        assert!(parse_id("a/b").is_err());
        assert_eq!(parse_mode("644"), Ok(0o644));
        assert_eq!(parse_mode("0755"), Ok(0o755));
        assert_eq!(parse_mode("0o600"), Ok(0o600));
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("77777").is_err());
        let volume = parse_volume("/srv/data:/data:ro").unwrap();
        assert_eq!(
            (
                volume.source.to_str(),
                volume.destination.as_str(),
                volume.read_only
            ),
            (Some("/srv/data"), "/data", true)
        );
        assert!(!parse_volume("/srv:/data").unwrap().read_only);
        assert!(!parse_volume("/srv:/data:rw").unwrap().read_only);
        for bad in [
            "/srv",
            "srv:/data",
            "/srv:data",
            "/srv:/data:rx",
            "/a:/b:ro:x",
        ] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
    }
}
