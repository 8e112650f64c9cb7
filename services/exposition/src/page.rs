//! The whole page, written in pieces: a scrape of a large cluster is
//! streamed family by family in bounded chunks instead of being assembled
//! whole (a 1000-node page is ~180 MiB of text).

use kai_proto::v1::{ContainerUsage, EscapedProcess, HostDevice, IsolationChecks};

use crate::Options;
use crate::families::{self, Ctx, HAMI, ISOLATION, Scope, Spec};

/// What one node contributes to a page.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    /// The `node` label of the host GPUs, escaped processes and checks
    /// (containers carry their own).
    pub node: &'a str,
    pub devices: &'a [HostDevice],
    pub containers: &'a [ContainerUsage],
    /// GPU processes on the node that no region accounts for.
    pub escaped: &'a [EscapedProcess],
    /// `None` when the node has not reported its checks.
    pub checks: Option<&'a IsolationChecks>,
}

/// Anything a page can be rendered from, one node at a time.
pub trait View {
    fn view(&self) -> NodeView<'_>;
}

impl View for NodeView<'_> {
    fn view(&self) -> NodeView<'_> {
        *self
    }
}

/// The `index`-th family of the page: HAMi (legacy included), then isolation.
fn family(index: usize) -> Option<&'static Spec> {
    HAMI.get(index)
        .or_else(|| ISOLATION.get(index.checked_sub(HAMI.len())?))
}

/// Where a page stands: the text of [`crate::render`] then
/// [`crate::render_isolation`] over every node, produced piece by piece.
///
/// Each family's samples stay contiguous after its `# HELP`/`# TYPE`, as
/// the text format requires: the page walks every node once per family.
#[derive(Clone, Debug)]
pub struct Page {
    opts: Options,
    family: usize,
    node: usize,
    item: usize,
    header_written: bool,
    /// Per node, whether its containers' label values need no escaping:
    /// checked in the first family that writes them, trusted in the rest.
    clean: Vec<bool>,
}

impl Page {
    pub fn new(opts: Options) -> Self {
        Self {
            opts,
            family: 0,
            node: 0,
            item: 0,
            header_written: false,
            clean: Vec::new(),
        }
    }

    /// Whether the whole page has been written.
    pub fn is_done(&self) -> bool {
        family(self.family).is_none()
    }

    /// Appends the next piece of the page to `out`, stopping at the first
    /// item boundary where `out` holds `limit` bytes or more (an item is a
    /// host GPU, a container, an escaped process or a node's checks, so a
    /// piece ends on a line boundary and overshoots `limit` by one item's
    /// lines at most). Returns whether more is to come.
    ///
    /// Every call must pass the same `nodes`: the page keeps positions in it.
    pub fn fill<V: View>(&mut self, nodes: &[V], out: &mut String, limit: usize) -> bool {
        while let Some(spec) = family(self.family) {
            if spec.legacy && !self.opts.legacy {
                self.next_family();
                continue;
            }
            if !self.header_written {
                spec.header(out);
                self.header_written = true;
            }
            while let Some(node) = nodes.get(self.node) {
                let node = node.view();
                let opts = &self.opts;
                let finished = match spec.scope() {
                    Scope::Host => resume(&mut self.item, node.devices, out, limit, |out, d| {
                        families::host(out, spec, node.node, d, opts);
                    }),
                    Scope::Container => {
                        let clean = match self.clean.get(self.node) {
                            Some(&clean) => clean,
                            None => {
                                let clean = families::all_clean(node.containers);
                                // Nodes are reached in order; cache only then.
                                if self.clean.len() == self.node {
                                    self.clean.push(clean);
                                }
                                clean
                            }
                        };
                        let ctx = Ctx { opts, clean };
                        resume(&mut self.item, node.containers, out, limit, |out, c| {
                            families::container(out, spec, c, ctx);
                        })
                    }
                    Scope::Escaped => resume(&mut self.item, node.escaped, out, limit, |out, e| {
                        families::escaped(out, spec, node.node, e, opts);
                    }),
                    Scope::Checks => {
                        let checks = node.checks.map(std::slice::from_ref).unwrap_or_default();
                        resume(&mut self.item, checks, out, limit, |out, c| {
                            families::checks(out, spec, node.node, c, opts);
                        })
                    }
                };
                if !finished {
                    return true;
                }
                self.node += 1;
                self.item = 0;
            }
            self.next_family();
        }
        false
    }

    fn next_family(&mut self) {
        self.family += 1;
        self.node = 0;
        self.item = 0;
        self.header_written = false;
    }
}

/// Writes `items` from `*next` on until `out` reaches `limit`; returns
/// whether all of them were written.
fn resume<T>(
    next: &mut usize,
    items: &[T],
    out: &mut String,
    limit: usize,
    mut write: impl FnMut(&mut String, &T),
) -> bool {
    for item in items.get(*next..).unwrap_or_default() {
        if out.len() >= limit {
            return false;
        }
        write(out, item);
        *next += 1;
    }
    true
}

/// The whole page into `out` (the node agent's and tests' way).
pub fn render_page<V: View>(out: &mut String, nodes: &[V], opts: Options) {
    Page::new(opts).fill(nodes, out, usize::MAX);
}
