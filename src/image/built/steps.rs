//! The processes a build runs in its build sandbox, in order: each an
//! argv (packages are single arguments, never parsed by a shell), its
//! environment and working directory.

use super::sources::PackageSources;
use super::spec::Plan;

/// Where a build with `apt_sources` writes them, inside the build sandbox.
const APT_SOURCES: &str = "/tmp/.sandboxd-build-apt.list";
const APT_PARTS: &str = "/tmp/.sandboxd-build-apt.d";

/// One process of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What the build log calls it.
    pub title: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
}

/// The Python packages apt adds when the base has no `python3`.
const PYTHON_DEBS: [&str; 3] = ["python3", "python3-pip", "python3-venv"];

/// The steps of `plan` over a base that has (`python_installed`) a Python
/// of the asked version or not.
pub fn steps(plan: &Plan, sources: &PackageSources, python_installed: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    let image_env: Vec<(String, String)> = plan
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if plan.uses_apt(python_installed) {
        steps.extend(apt_steps(plan, sources, python_installed));
    }
    if !plan.python_packages.is_empty() {
        let mut argv = words(&[
            "python3",
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--break-system-packages",
            "--root-user-action=ignore",
            "--disable-pip-version-check",
            "--no-input",
            "--index-url",
        ]);
        argv.push(sources.pip_index_url.clone());
        if let Some(host) = sources.pip_trusted_host() {
            argv.push("--trusted-host".into());
            argv.push(host);
        }
        argv.extend(plan.python_packages.iter().cloned());
        steps.push(Step {
            title: format!("pip install {}", plan.python_packages.join(" ")),
            argv,
            env: image_env.clone(),
            cwd: None,
        });
    }
    if let Some(dir) = &plan.workdir {
        steps.push(Step {
            title: format!("mkdir -p {dir}"),
            argv: vec!["mkdir".into(), "-p".into(), "--".into(), dir.clone()],
            env: Vec::new(),
            cwd: None,
        });
    }
    for command in &plan.commands {
        steps.push(Step {
            title: command.clone(),
            argv: vec!["/bin/sh".into(), "-c".into(), command.clone()],
            env: image_env.clone(),
            cwd: plan.workdir.clone(),
        });
    }
    steps
}

fn apt_steps(plan: &Plan, sources: &PackageSources, python_installed: bool) -> Vec<Step> {
    let env = vec![("DEBIAN_FRONTEND".to_string(), "noninteractive".to_string())];
    let mut apt = words(&["apt-get", "-q", "-o", "Acquire::Retries=2"]);
    let mut steps = Vec::new();
    if !sources.apt_sources.is_empty() {
        // The configured sources replace the image's own for this build
        // only; the image keeps its sources.list.
        let mut write = words(&[
            "/bin/sh",
            "-c",
            r#"mkdir -p "$1" && shift && printf '%s\n' "$@" > "$0""#,
            APT_SOURCES,
            APT_PARTS,
        ]);
        write.extend(sources.apt_sources.iter().cloned());
        steps.push(Step {
            title: "configure apt sources".into(),
            argv: write,
            env: Vec::new(),
            cwd: None,
        });
        apt.extend(words(&[
            "-o",
            &format!("Dir::Etc::SourceList={APT_SOURCES}"),
            "-o",
            &format!("Dir::Etc::SourceParts={APT_PARTS}"),
        ]));
    }
    let mut update = apt.clone();
    update.push("update".into());
    steps.push(Step {
        title: "apt-get update".into(),
        argv: update,
        env: env.clone(),
        cwd: None,
    });
    let mut packages: Vec<String> = Vec::new();
    if plan.python.is_some() && !python_installed {
        packages.extend(PYTHON_DEBS.iter().map(|s| s.to_string()));
    }
    packages.extend(plan.system_packages.iter().cloned());
    let mut install = apt;
    install.extend(words(&["install", "-y", "--no-install-recommends"]));
    install.extend(packages.iter().cloned());
    steps.push(Step {
        title: format!("apt-get install {}", packages.join(" ")),
        argv: install,
        env,
        cwd: None,
    });
    // Package lists and downloaded .debs are dead weight in an image.
    steps.push(Step {
        title: "clean apt caches".into(),
        argv: words(&[
            "/bin/sh",
            "-c",
            "apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/.sandboxd-build-apt*",
        ]),
        env: Vec::new(),
        cwd: None,
    });
    steps
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::built::ImageSpec;

    #[test]
    fn packages_are_arguments_and_commands_run_in_the_workdir() {
        let spec = ImageSpec {
            python_version: Some("3.11".into()),
            python_packages: vec!["pandas==2.2.3".into()],
            system_packages: vec!["git".into()],
            commands: vec!["echo hi > x".into()],
            workdir: Some("/workspace".into()),
            env: [("A".to_string(), "1".to_string())].into(),
            ..ImageSpec::default()
        };
        let plan = spec.plan("python").unwrap();
        let sources = PackageSources {
            pip_index_url: "http://203.0.113.11/simple".into(),
            apt_sources: vec!["deb [trusted=yes] http://203.0.113.11/apt ./".into()],
        };
        let steps = steps(&plan, &sources, true);
        let titles: Vec<&str> = steps.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "configure apt sources",
                "apt-get update",
                "apt-get install git",
                "clean apt caches",
                "pip install pandas==2.2.3",
                "mkdir -p /workspace",
                "echo hi > x",
            ]
        );
        let pip = &steps[4].argv;
        assert_eq!(pip.last().map(String::as_str), Some("pandas==2.2.3"));
        assert!(pip
            .windows(2)
            .any(|w| w == ["--trusted-host", "203.0.113.11"]));
        assert_eq!(steps[6].cwd.as_deref(), Some("/workspace"));
        assert_eq!(steps[6].env, [("A".to_string(), "1".to_string())]);
        assert!(steps[1].argv.iter().any(|a| a.contains(APT_SOURCES)));
    }

    #[test]
    fn a_base_without_python_gets_it_from_apt() {
        let spec = ImageSpec {
            python_version: Some("3.13".into()),
            ..ImageSpec::default()
        };
        let plan = spec.plan("python").unwrap();
        let steps = steps(&plan, &PackageSources::default(), false);
        let install = steps
            .iter()
            .find(|s| s.title.starts_with("apt-get install"))
            .unwrap();
        assert!(install.argv.contains(&"python3-pip".to_string()));
        // The image's own sources: nothing replaces them.
        assert!(!steps.iter().any(|s| s.title == "configure apt sources"));
        assert!(spec.plan("python").unwrap().uses_apt(false));
        assert!(!ImageSpec::default().plan("python").unwrap().uses_apt(true));
    }
}
