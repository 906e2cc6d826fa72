//! The pause image, built here because no registry can be reached: a static C binary
//! (`pause.c`) in one gzipped layer, packed as an OCI image-layout tarball whose index
//! names it [`PAUSE_IMAGE`], so `ctr images import` tags it without further flags.
//!
//! Built once per content into a cache shared by every test process
//! (`$TMPDIR/interlock-testkit-pause/<hash>/pause.tar`), by rename so that two processes
//! building at once both end up with a whole file.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::json;
use sha2::{Digest, Sha256};

/// The image reference the kit's containerd uses as `sandbox_image`.
pub const PAUSE_IMAGE: &str = "localhost/pause:test";

const PAUSE_C: &str = include_str!("pause.c");
/// Bumped when the packing below changes, so an old cached tarball is not reused.
const FORMAT: &str = "oci-layout-1";

/// The pause image tarball, built on first use in this process (or found in the cache).
pub fn pause_image() -> io::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_cached().map_err(|e| format!("building the pause image: {e}")))
        .clone()
        .map_err(io::Error::other)
}

fn build_cached() -> io::Result<PathBuf> {
    let key = hex::encode(Sha256::digest(format!(
        "{FORMAT}\n{}\n{PAUSE_C}",
        std::env::consts::ARCH
    )));
    let cache = std::env::temp_dir().join("interlock-testkit-pause");
    let dir = cache.join(&key[..16]);
    let tarball = dir.join("pause.tar");
    if tarball.is_file() {
        return Ok(tarball);
    }
    fs::create_dir_all(&cache)?;
    let work = tempfile::Builder::new()
        .prefix(".build-")
        .tempdir_in(&cache)?;
    let source = work.path().join("pause.c");
    let binary = work.path().join("pause");
    fs::write(&source, PAUSE_C)?;
    let out = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .map_err(|e| io::Error::other(format!("running gcc (install gcc and libc6-dev): {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "gcc -static pause.c failed (is libc6-dev installed?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let staged = work.path().join("out");
    fs::create_dir(&staged)?;
    write_oci_archive(&fs::read(&binary)?, &staged.join("pause.tar"))?;
    // Whoever renames first wins; a loser's copy is identical and goes with `work`.
    match fs::rename(&staged, &dir) {
        Ok(()) => {}
        Err(_) if tarball.is_file() => {}
        Err(e) => return Err(e),
    }
    Ok(tarball)
}

/// The OCI architecture name of this machine.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes an OCI image layout (as a tar archive) holding one image: `binary` as `/pause`,
/// the entrypoint.
pub fn write_oci_archive(binary: &[u8], archive: &Path) -> io::Result<()> {
    let layer_tar = tar_of(&[("pause", binary, 0o755)])?;
    let diff_id = sha256(&layer_tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&layer_tar)?;
    let layer = gz.finish()?;
    let config = serde_json::to_vec(&json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created_by": "interlock-testkit pause.c"}],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", sha256(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", sha256(&layer)),
            "size": layer.len(),
        }],
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", sha256(&manifest)),
            "size": manifest.len(),
            "platform": {"architecture": oci_arch(), "os": "linux"},
            "annotations": {
                "io.containerd.image.name": PAUSE_IMAGE,
                "org.opencontainers.image.ref.name": "test",
            },
        }],
    }))?;
    let blob = |data: &[u8]| format!("blobs/sha256/{}", sha256(data));
    let archive_bytes = tar_of(&[
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644),
        ("index.json", &index, 0o644),
        (&blob(&manifest), &manifest, 0o644),
        (&blob(&config), &config, 0o644),
        (&blob(&layer), &layer, 0o644),
    ])?;
    fs::write(archive, archive_bytes)
}

/// A tar archive of regular files (owner root, mtime 0: the same bytes every build).
fn tar_of(files: &[(&str, &[u8], u32)]) -> io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, *data)?;
    }
    builder.into_inner()
}

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_a_self_consistent_oci_layout_naming_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar");
        write_oci_archive(b"\x7fELF not really", &archive).unwrap();
        let mut files = std::collections::BTreeMap::new();
        let mut ar = tar::Archive::new(fs::File::open(&archive).unwrap());
        for entry in ar.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            io::Read::read_to_end(&mut entry, &mut data).unwrap();
            files.insert(path, data);
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            PAUSE_IMAGE
        );
        let blob = |digest: &serde_json::Value| {
            let digest = digest.as_str().unwrap();
            let data = &files[&format!("blobs/sha256/{}", &digest[7..])];
            assert_eq!(format!("sha256:{}", sha256(data)), digest, "blob digest");
            data.clone()
        };
        let manifest: serde_json::Value = serde_json::from_slice(&blob(&entry["digest"])).unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
        let layer = blob(&manifest["layers"][0]["digest"]);
        let mut plain = Vec::new();
        io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&layer[..]), &mut plain).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            format!("sha256:{}", sha256(&plain))
        );
        let mut layer_files = tar::Archive::new(&plain[..]);
        let first = layer_files.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(first.path().unwrap().to_str(), Some("pause"));
        assert_eq!(first.header().mode().unwrap(), 0o755);
        assert!(files.contains_key("oci-layout"));
        // Same input, same bytes: the digest in a cached copy stays valid.
        let again = dir.path().join("b.tar");
        write_oci_archive(b"\x7fELF not really", &again).unwrap();
        assert_eq!(fs::read(&archive).unwrap(), fs::read(&again).unwrap());
    }
}
