//! The store kept up to date from the watch's changes must read exactly
//! what a full listing reads, and the changes must matter: without them a
//! replaced region would still be read from its old mapping.

use std::path::{Path, PathBuf};

use kai_region::writer::{RegionBuilder, UsageSpec};

use super::*;

fn dir_of(root: &Path, i: u32) -> PathBuf {
    root.join(format!("{i:08x}-0000-4000-8000-000000000000_main"))
}

fn region(limit_mib: u64) -> RegionBuilder {
    RegionBuilder::v1()
        .device("GPU-0", limit_mib << 20)
        .process(100, vec![UsageSpec::data(1 << 20, 2 << 20)])
}

fn add(root: &Path, i: u32, limit_mib: u64) -> std::io::Result<PathBuf> {
    let dir = dir_of(root, i);
    std::fs::create_dir(&dir)?;
    region(limit_mib).write(&dir.join(discovery::CACHE_FILE))?;
    Ok(dir)
}

/// (key, limit of device 0) of every readable region.
fn limits(scan: &Scan) -> Vec<(String, u64)> {
    scan.regions
        .iter()
        .map(|r| {
            let limit = r.snapshot.devices.first().map_or(0, |d| d.limit);
            (r.key.dir_name(), limit)
        })
        .collect()
}

/// What a store that lists everything afresh reads now.
fn fresh(root: &Path) -> Vec<(String, u64)> {
    limits(&RegionStore::new(root).scan(&Listing::Refresh))
}

fn changed(dirs: impl IntoIterator<Item = PathBuf>) -> Listing {
    Listing::Changed(dirs.into_iter().collect())
}

#[test]
fn named_changes_keep_the_listing_exact_without_listing() -> std::io::Result<()> {
    let root = tempfile::tempdir()?;
    for i in 0..4 {
        add(root.path(), i, 100 + u64::from(i))?;
    }
    let mut store = RegionStore::new(root.path());
    assert_eq!(limits(&store.scan(&Listing::Refresh)), fresh(root.path()));

    // A directory appeared, one went away.
    let new = add(root.path(), 9, 900)?;
    let gone = dir_of(root.path(), 1);
    std::fs::remove_dir_all(&gone)?;
    let scan = store.scan(&changed([new, gone]));
    assert_eq!(limits(&scan), fresh(root.path()));
    assert_eq!(scan.dirs.len(), 4);
    assert!(limits(&scan).iter().any(|(_, limit)| *limit == 900 << 20));

    // A region replaced by a new file (libvgpu recreating it): only its
    // directory is named, and the new values are read.
    let replaced = dir_of(root.path(), 2);
    region(222).replace(&replaced.join(discovery::CACHE_FILE))?;
    assert!(
        !limits(&store.scan(&Listing::Unchanged)).contains(&(
            replaced
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_owned(),
            222 << 20
        )),
        "unnamed, the old mapping is still read: the change is what matters"
    );
    assert_eq!(
        limits(&store.scan(&changed([replaced]))),
        fresh(root.path())
    );

    // Deleted and recreated under the same name within one burst.
    let again = dir_of(root.path(), 3);
    std::fs::remove_dir_all(&again)?;
    add(root.path(), 3, 333)?;
    assert_eq!(limits(&store.scan(&changed([again]))), fresh(root.path()));

    // Nothing but the named entries is looked at: a directory the watch
    // did not name stays unseen (a listing would find it).
    let unnamed = add(root.path(), 7, 700)?;
    let scan = store.scan(&changed([dir_of(root.path(), 0)]));
    assert!(!scan.dirs.iter().any(|f| f.dir == unnamed), "not listed");
    assert_ne!(limits(&scan), fresh(root.path()));
    Ok(())
}

#[test]
fn a_failed_listing_is_listed_again_whatever_the_watch_says() -> std::io::Result<()> {
    let parent = tempfile::tempdir()?;
    let root = parent.path().join("containers");
    let mut store = RegionStore::new(&root);
    // Not there yet: the listing fails (and is empty).
    assert!(store.scan(&Listing::Refresh).regions.is_empty());
    std::fs::create_dir(&root)?;
    add(&root, 0, 100)?;
    // The watch (armed only now) names nothing; the failed listing is not
    // trusted.
    assert_eq!(limits(&store.scan(&Listing::Unchanged)), fresh(&root));
    Ok(())
}

#[test]
fn entries_that_are_not_container_directories_are_ignored() -> std::io::Result<()> {
    let root = tempfile::tempdir()?;
    add(root.path(), 0, 100)?;
    let mut store = RegionStore::new(root.path());
    store.scan(&Listing::Refresh);
    let file = root.path().join("uid_file");
    std::fs::write(&file, b"not a directory")?;
    let odd = root.path().join("nounderscore");
    std::fs::create_dir(&odd)?;
    let scan = store.scan(&changed([file, odd]));
    assert_eq!(limits(&scan), fresh(root.path()));
    assert_eq!(scan.dirs.len(), 1);
    Ok(())
}

#[test]
fn an_entry_outside_the_directory_falls_back_to_a_listing() -> std::io::Result<()> {
    let root = tempfile::tempdir()?;
    add(root.path(), 0, 100)?;
    let mut store = RegionStore::new(root.path());
    store.scan(&Listing::Refresh);
    // Not named, but a listing finds it.
    add(root.path(), 1, 101)?;
    let elsewhere = tempfile::tempdir()?;
    let scan = store.scan(&changed([elsewhere.path().join("x_y")]));
    assert_eq!(limits(&scan), fresh(root.path()));
    assert_eq!(scan.dirs.len(), 2);
    Ok(())
}

/// A region file that is there but refused is listed as such, every scan
/// (not only the one that logs it); a directory whose file is not written
/// yet is not: that is "no region" for now.
#[test]
fn refused_regions_are_listed_with_why_and_unwritten_ones_are_not() -> std::io::Result<()> {
    let root = tempfile::tempdir()?;
    add(root.path(), 1, 1024)?;
    let linked = add(root.path(), 2, 1024)?.join(discovery::CACHE_FILE);
    std::fs::hard_link(&linked, root.path().join("elsewhere.cache"))?;
    std::fs::create_dir(dir_of(root.path(), 3))?;
    let mut store = RegionStore::new(root.path());
    for _ in 0..2 {
        let scan = store.scan(&Listing::Refresh);
        let refused: Vec<_> = scan
            .refused
            .iter()
            .map(|(key, why)| (key.dir_name(), *why))
            .collect();
        assert_eq!(
            refused,
            [(
                dir_of(root.path(), 2)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned(),
                "hard_linked"
            )]
        );
        assert_eq!(limits(&scan).len(), 1, "the readable one is read");
    }
    Ok(())
}
