use super::*;

/// Resolves once `changed` fired, or reports that it did not within a
/// bound used only to fail the test (never to synchronise it).
async fn fired(watch: &mut DirWatch) -> bool {
    tokio::time::timeout(Duration::from_secs(10), watch.changed())
        .await
        .is_ok()
}

#[tokio::test]
async fn reads_do_not_wake_the_watch_but_a_new_entry_does() -> io::Result<()> {
    let root = tempfile::tempdir()?;
    let child = root.path().join("uid_ctr");
    std::fs::create_dir(&child)?;
    std::fs::write(child.join("usage.cache"), b"region")?;
    let mut watch = DirWatch::new([root.path().to_owned()], Depth::RootAndChildren)?;
    assert!(watch.fully_armed());

    // Everything a scan does: list, stat, open and read.
    for _ in 0..100 {
        for entry in std::fs::read_dir(root.path())? {
            let entry = entry?;
            std::fs::read_dir(entry.path())?.count();
            std::fs::read(entry.path().join("usage.cache"))?;
        }
    }
    // A write in a child is the first event the watch may report.
    std::fs::write(child.join("usage.cache"), b"rewritten")?;
    let Some(stream) = watch.stream.as_mut() else {
        panic!("stream set up");
    };
    let first = stream.next().await.transpose()?;
    let mask = first.map(|e| e.mask).unwrap_or(EventMask::empty());
    assert!(
        !mask.intersects(EventMask::OPEN | EventMask::ACCESS | EventMask::CLOSE_NOWRITE),
        "a read woke the watch: {mask:?}"
    );
    assert!(mask.intersects(EventMask::CREATE | EventMask::CLOSE_WRITE));
    Ok(())
}

#[tokio::test]
async fn a_burst_is_one_change_and_new_children_are_watched() -> io::Result<()> {
    let root = tempfile::tempdir()?;
    let mut watch = DirWatch::new([root.path().to_owned()], Depth::RootAndChildren)?;
    assert!(
        !watch.changes_since_last_asked().nothing_changed(),
        "nothing to compare with on the first ask"
    );
    assert!(
        watch.changes_since_last_asked().nothing_changed(),
        "armed and quiet"
    );
    // A container directory and its region, as libvgpu creates them.
    let child = root.path().join("uid_ctr");
    std::fs::create_dir(&child)?;
    std::fs::write(child.join("usage.cache"), b"region")?;
    assert!(fired(&mut watch).await);
    assert!(
        !watch.changes_since_last_asked().nothing_changed(),
        "the burst is also reported to pollers"
    );
    assert!(watch.changes_since_last_asked().nothing_changed(), "once");
    assert!(
        watch
            .by_wd
            .values()
            .any(|w| matches!(w, Watched::Child(dir) if *dir == child)),
        "the new directory got a watch of its own"
    );
    // The file inside the new directory is now seen on its own too.
    std::fs::rename(child.join("usage.cache"), child.join("usage.cache.old"))?;
    assert!(fired(&mut watch).await);
    Ok(())
}

#[tokio::test]
async fn a_root_that_appears_later_is_armed_by_rearm() -> io::Result<()> {
    let parent = tempfile::tempdir()?;
    let root = parent.path().join("containers");
    let mut watch = DirWatch::new([root.clone()], Depth::Root)?;
    assert!(!watch.fully_armed());
    std::fs::create_dir(&root)?;
    watch.rearm();
    assert!(watch.fully_armed());
    std::fs::write(root.join("a"), b"x")?;
    assert!(fired(&mut watch).await);

    // Removed: unarmed again (after the events that say so), then re-armed.
    std::fs::remove_file(root.join("a"))?;
    std::fs::remove_dir(&root)?;
    while watch.fully_armed() {
        assert!(fired(&mut watch).await);
    }
    std::fs::create_dir(&root)?;
    watch.rearm();
    assert!(watch.fully_armed());
    Ok(())
}

#[tokio::test]
async fn changes_name_exactly_the_entries_concerned() -> io::Result<()> {
    let root = tempfile::tempdir()?;
    let kept = root.path().join("uid-1_main");
    std::fs::create_dir(&kept)?;
    std::fs::write(kept.join("usage.cache"), b"region")?;
    let mut watch = DirWatch::new([root.path().to_owned()], Depth::RootAndChildren)?;
    assert_eq!(
        watch.changes_since_last_asked(),
        Changes::Unknown,
        "first ask"
    );
    assert!(
        watch.changes_since_last_asked().nothing_changed(),
        "armed and quiet"
    );

    // A new container directory with its region: only that entry.
    let new = root.path().join("uid-2_main");
    std::fs::create_dir(&new)?;
    std::fs::write(new.join("usage.cache"), b"region")?;
    assert!(fired(&mut watch).await);
    let changes = watch.changes_since_last_asked();
    assert_eq!(changes, Changes::Known(BTreeSet::from([new.clone()])));

    // A region replaced inside a directory that stays: that directory.
    std::fs::write(kept.join("usage.cache.tmp"), b"new region")?;
    std::fs::rename(kept.join("usage.cache.tmp"), kept.join("usage.cache"))?;
    assert!(fired(&mut watch).await);
    assert_eq!(
        watch.changes_since_last_asked(),
        Changes::Known(BTreeSet::from([kept.clone()]))
    );
    assert!(
        watch.changes_since_last_asked().nothing_changed(),
        "reported once"
    );

    // The root itself removed: nothing can be vouched for.
    std::fs::remove_dir_all(root.path())?;
    while watch.fully_armed() {
        assert!(fired(&mut watch).await);
    }
    assert_eq!(watch.changes_since_last_asked(), Changes::Unknown);
    Ok(())
}

#[tokio::test]
async fn a_renamed_directory_is_named_by_its_new_path() -> io::Result<()> {
    let root = tempfile::tempdir()?;
    let old = root.path().join("uid-1_main");
    std::fs::create_dir(&old)?;
    std::fs::write(old.join("usage.cache"), b"region")?;
    let mut watch = DirWatch::new([root.path().to_owned()], Depth::RootAndChildren)?;
    watch.changes_since_last_asked();

    let new = root.path().join("uid-2_main");
    std::fs::rename(&old, &new)?;
    assert!(fired(&mut watch).await);
    assert_eq!(
        watch.changes_since_last_asked(),
        Changes::Known(BTreeSet::from([old.clone(), new.clone()]))
    );
    // Its own watch moved with it: a change inside names the new path.
    std::fs::write(new.join("usage.cache"), b"rewritten")?;
    assert!(fired(&mut watch).await);
    assert_eq!(
        watch.changes_since_last_asked(),
        Changes::Known(BTreeSet::from([new]))
    );
    Ok(())
}

#[tokio::test]
async fn an_owner_that_never_asks_keeps_a_bounded_record() -> io::Result<()> {
    let root = tempfile::tempdir()?;
    let mut watch = DirWatch::new([root.path().to_owned()], Depth::Root)?;
    watch.changes_since_last_asked();
    assert!(watch.changes_since_last_asked().nothing_changed());
    for i in 0..=MAX_SEEN {
        std::fs::write(root.path().join(format!("f{i}")), b"x")?;
    }
    // Follow the bursts until the record gives up (a record without a
    // bound never does, and the last `fired` then fails).
    while watch.seen.is_some() {
        assert!(fired(&mut watch).await, "events pending while recorded");
    }
    assert_eq!(watch.changes_since_last_asked(), Changes::Unknown);
    Ok(())
}
