#!/usr/bin/env python3
"""The web view's sign-in, in headless Chromium (issue #27).

With access control on, the aggregator's API answers 401 without a
Kubernetes bearer token; the page (services/aggregator/src/web/assets) then
asks for one, keeps it in this tab's sessionStorage only and sends it as
`X-Kai-Authorization: Bearer <token>` on every API call, the change stream
included (read with fetch: EventSource cannot send a header).

check_token_prompt() drives a fresh Chromium profile over the DevTools
protocol on a pipe and returns one (name, ok, detail) per assertion:

  1. no token: the prompt (a password field), the server's message, no rows;
  2. a bad token: the prompt stays, with the server's own 401 message;
  3. the good token: rows of the expected pods, none of the forbidden ones;
  4. the token is in sessionStorage and nowhere else (localStorage, cookies,
     the URL), and went out as X-Kai-Authorization, the event stream too;
  5. (with change=) a change in the cluster shows without a reload while
     the header-carrying event stream stays open;
  6. a reload keeps the tab signed in;
  7. (with forbidden_token=) a caller who may see nothing gets the
     server's 403 message in the page, no prompt, no rows;
  8. Sign out: the prompt again, no rows, no token left; a reload still asks.

Screenshots go to out_dir. Standard library only; importable:

  from webview_auth import check_token_prompt
  results = check_token_prompt("http://127.0.0.1:8080/", good, bad,
                               expect_pod_names=["trainer-0"], forbid_pod_names=["other-0"],
                               out_dir="/tmp/out", change=make_pod, changed_pod="new-0")
  failed = [r for r in results if not r[1]]

or from a shell:

  webview_auth.py URL GOOD_TOKEN BAD_TOKEN --expect POD ... --forbid POD ... --out DIR
  (a token argument "@FILE" reads the token from FILE; the exit status is
  the number of failed assertions)
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from kaitest.devtools import DevTools, PageError
from kaitest.poll import poll

WAIT = 60  # seconds any awaited condition may take on a loaded machine

# Every container row's key (namespace/pod/container/gpu), the list scrolled
# through: it is virtualised, only the rows in sight exist at a time.
ROW_KEYS = """(async () => {
  const l = document.getElementById('containers');
  if (!l) return [];
  const keys = new Set();
  const frame = () => new Promise((r) => {
    const t = setTimeout(r, 300);
    requestAnimationFrame(() => requestAnimationFrame(() => { clearTimeout(t); r(); }));
  });
  const grab = () => {
    for (const r of l.querySelectorAll('.row[data-key]')) if (r.style.display !== 'none') keys.add(r.dataset.key);
  };
  const saved = l.scrollTop;
  l.scrollTop = 0; await frame(); grab();
  while (l.scrollTop + l.clientHeight < l.scrollHeight) {
    const before = l.scrollTop;
    l.scrollTop = before + Math.max(1, l.clientHeight - 26);
    await frame(); grab();
    if (l.scrollTop === before) break;
  }
  l.scrollTop = saved;
  return [...keys];
})()"""

# The pods the escaped-process table names ("namespace/pod[/container]").
ESCAPED_PODS = """[...document.querySelectorAll('#escaped tr')].slice(1)
  .map((tr) => (tr.cells[4] ? tr.cells[4].textContent : '')).filter((t) => t.includes('/'))
  .map((t) => t.split('/')[1])"""

PAGE_STATE = """(() => {
  const s = document.getElementById('signin');
  const n = document.getElementById('notice');
  const o = document.getElementById('signout');
  const st = document.getElementById('status');
  if (!st || !document.body) return {auth: 'loading', prompt: false, promptState: '', message: '', tokenType: '',
                                     notice: '', noticeKind: '', signout: false, live: '', status: '', updates: 0};
  return {
    auth: document.body.dataset.auth || '',
    prompt: !!s && !s.hidden, promptState: s ? s.dataset.state || '' : '',
    message: (document.getElementById('signin-message') || {}).textContent || '',
    tokenType: (document.getElementById('token') || {}).type || '',
    notice: !!n && !n.hidden ? n.textContent : '', noticeKind: n && !n.hidden ? n.dataset.kind || '' : '',
    signout: !!o && !o.hidden,
    live: st.dataset.live, status: st.textContent,
    updates: Number(document.body.dataset.updates || 0),
  };
})()"""


def wait_for(what, fn, timeout=WAIT, show=None):
    """poll.poll with the page's errors as "not yet"; on a timeout the error
    names `show()` (what there was instead) if given, else fn's last answer."""
    return poll(what, fn, timeout, (ValueError, KeyError, PageError), show)


def check_token_prompt(base_url, good_token, bad_token, expect_pod_names, forbid_pod_names, out_dir,
                       change=None, changed_pod=None, forbidden_token=None, chromium=None,
                       ignore_certificate_errors=False, timeout=WAIT):
    """Drives the web view at base_url through sign-in, a live update and sign-out.

    base_url: the page (the aggregator's "/", or the service-proxy path ending
      in "/"), reachable from this host.
    good_token: a token that may see expect_pod_names; bad_token: one the API
      server rejects (401).
    expect_pod_names / forbid_pod_names: pod names that must / must not have a
      row once signed in with good_token (the escaped-process table is
      checked for the forbidden ones too).
    change: an optional callable that changes the cluster (it may block until
      the aggregator sees it); changed_pod: a pod name that must then get a
      row (without it, any new model drawn will do).
    forbidden_token: an optional token the API server accepts but that may
      see nothing (403 from the view).
    Returns [(name, ok, detail)]. After the first failed assertion the rest
    are reported as not run (each builds on the one before).
    """
    os.makedirs(out_dir, exist_ok=True)
    results = []
    profile = tempfile.mkdtemp(prefix="chromium-webview-auth-", dir=out_dir)
    extra = ["--ignore-certificate-errors"] if ignore_certificate_errors else []
    browser = None
    # The page's API calls are relative: under base_url, behind a proxy's
    # prefix (which has an "/api/" of its own) too.
    api_base = base_url.split("?")[0].split("#")[0]
    api_base = (api_base if api_base.endswith("/") else api_base + "/") + "api/"
    expect = list(expect_pod_names)
    forbid = set(forbid_pod_names)
    signed_in_at = [0]  # index into browser.events when the good token went in

    def state():
        return browser.js(PAGE_STATE)

    def pods():
        return {k.split("/")[1] for k in browser.js(ROW_KEYS) or []}

    def type_token(token):
        browser.js("document.getElementById('token').value = ''; document.getElementById('token').focus()")
        browser.page("Input.insertText", text=token)
        browser.js("document.getElementById('signin-submit').click()")

    def server_says(token):
        """The API's own answer to the view with `token` (from the page's origin)."""
        return browser.js("""fetch('api/v1/view', {cache: 'no-store', headers: %s})
            .then(async (r) => ({status: r.status, text: await r.text(),
                                 challenge: r.headers.get('WWW-Authenticate') || ''}))""" % json.dumps(
            {"X-Kai-Authorization": "Bearer " + token} if token else {}))

    def error_of(answer):
        try:
            return json.loads(answer["text"])["error"]
        except (ValueError, KeyError, TypeError):
            return answer["text"].strip()

    def stored():
        return browser.js("""(() => {
            const all = (s) => { const o = {}; for (let i = 0; i < s.length; i++) o[s.key(i)] = s.getItem(s.key(i)); return o; };
            return {session: all(sessionStorage), local: all(localStorage), cookie: document.cookie, href: location.href};
        })()""")

    def requests(since=0):
        return [e["params"] for e in browser.events[since:] if e["method"] == "Network.requestWillBeSent"]

    def header(req, name):
        return next((v for k, v in req["request"].get("headers", {}).items() if k.lower() == name.lower()), None)

    def prompt_up(s):
        return s["prompt"] and s["auth"] == "signin" and s

    # --- the steps --------------------------------------------------------------

    def no_token():
        browser.page("Page.navigate", url=base_url)
        s = wait_for("the sign-in prompt", lambda: prompt_up(state()), timeout, show=state)
        answer = server_says(None)
        assert answer["status"] == 401, f"the API answers {answer['status']} without a token, not 401: {answer}"
        assert s["tokenType"] == "password", f"the token field is a {s['tokenType']!r} input"
        assert error_of(answer) in s["message"], f"prompt says {s['message']!r}, the server {error_of(answer)!r}"
        got = pods()
        assert not got, f"rows drawn before sign-in: {sorted(got)}"
        assert not s["signout"], "Sign out shown while signed out"
        browser.screenshot(os.path.join(out_dir, "webview-signin.png"))
        return f"prompt: {s['message']!r}; WWW-Authenticate: {answer['challenge']!r}"

    def bad():
        answer = server_says(bad_token)
        assert answer["status"] == 401, f"the API answers {answer['status']} to the bad token, not 401"
        type_token(bad_token)
        s = wait_for("the prompt to show the rejection",
                     lambda: (lambda s: s["prompt"] and s["promptState"] == "error" and s)(state()), timeout, show=state)
        assert error_of(answer) in s["message"], f"prompt says {s['message']!r}, the server {error_of(answer)!r}"
        st = stored()
        assert bad_token not in json.dumps(st), f"the rejected token is still stored (sessionStorage keys {list(st['session'])})"
        got = pods()
        assert not got, f"rows drawn with a bad token: {sorted(got)}"
        return f"prompt: {s['message']!r}"

    def good():
        signed_in_at[0] = len(browser.events)
        type_token(good_token)
        wait_for("the prompt to go", lambda: not state()["prompt"], timeout, show=state)
        got = wait_for(f"rows of {expect}", lambda: (lambda p: set(expect) <= p and p)(pods()), timeout,
                       show=lambda: {"pods": sorted(pods()), "page": state()})
        shown = got & forbid
        assert not shown, f"rows of pods this token may not see: {sorted(shown)}"
        escaped = set(browser.js(ESCAPED_PODS) or [])
        assert not escaped & forbid, f"escaped processes of pods this token may not see: {sorted(escaped & forbid)}"
        s = state()
        assert s["signout"] and s["auth"] == "token", f"signed in, yet {s}"
        browser.screenshot(os.path.join(out_dir, "webview-signed-in.png"))
        return f"{len(got)} pods drawn: {sorted(got)[:20]}"

    def storage():
        st = stored()
        assert good_token in st["session"].values(), f"sessionStorage holds {list(st['session'])}"
        assert good_token not in json.dumps(st["local"]), "the token is in localStorage"
        assert not st["cookie"], f"document.cookie: {st['cookie']!r}"
        cookies = browser.page("Network.getCookies", urls=[base_url])["cookies"]
        assert not cookies, f"cookies: {[c['name'] for c in cookies]}"
        assert good_token not in st["href"], "the token is in the URL"
        sent = requests(signed_in_at[0])
        api = [r for r in sent if r["request"]["url"].startswith(api_base)]
        assert api, "no API request seen since sign-in"
        leaked = [r["request"]["url"] for r in requests() if good_token in r["request"]["url"]]
        assert not leaked, f"the token in request URLs: {leaked}"
        without = [r["request"]["url"] for r in api if header(r, "X-Kai-Authorization") != "Bearer " + good_token]
        assert not without, f"API requests without the token's X-Kai-Authorization: {without}"
        stream = [r for r in api if r["request"]["url"].endswith("/api/v1/view/events")]
        assert stream, "no event stream request since sign-in"
        assert all(header(r, "Authorization") is None for r in api), "the page set Authorization itself"
        return f"sessionStorage keys {list(st['session'])}; {len(api)} API requests with X-Kai-Authorization"

    def live_change():
        browser.js("window.__sameDocument = 'yes'")
        before = state()["updates"]
        if changed_pod:
            assert changed_pod not in pods(), f"{changed_pod} has a row before the change"
        change()
        if changed_pod:
            wait_for(f"a row of {changed_pod}", lambda: changed_pod in pods(), timeout,
                     show=lambda: {"pods": sorted(pods()), "page": state()})
        else:
            wait_for("a new model drawn", lambda: state()["updates"] > before, timeout, show=state)
        s = state()
        assert s["updates"] > before, "no new model drawn"
        assert browser.js("window.__sameDocument") == "yes", "the page was reloaded"
        assert browser.js("performance.getEntriesByType('navigation').length") == 1, "a navigation happened"
        assert s["live"] == "live", f"the event stream is not live (polling?): {s['status']!r}"
        streams = [r for r in requests(signed_in_at[0]) if r["request"]["url"].endswith("/api/v1/view/events")]
        done = {e["params"]["requestId"] for e in browser.events
                if e["method"] in ("Network.loadingFinished", "Network.loadingFailed")}
        open_ = [r for r in streams if r["requestId"] not in done]
        assert open_, f"no event stream open ({len(streams)} opened since sign-in, all ended)"
        assert all(header(r, "X-Kai-Authorization") == "Bearer " + good_token for r in open_), \
            "the open stream does not carry the token"
        return f"{s['updates'] - before} update(s) over the open stream; status {s['status']!r}"

    def reload_keeps():
        mark = len(browser.events)
        browser.page("Page.reload", ignoreCache=True)
        wait_for(f"rows of {expect} after a reload", lambda: set(expect) <= pods(), timeout,
                 show=lambda: {"pods": sorted(pods()), "page": state()})
        s = state()
        assert not s["prompt"] and s["signout"], f"after a reload: {s}"
        api = [r for r in requests(mark) if r["request"]["url"].startswith(api_base)]
        assert api and all(header(r, "X-Kai-Authorization") == "Bearer " + good_token for r in api), \
            "API requests after the reload without the token"
        return f"{len(api)} API requests after the reload, all with the token"

    def sign_out():
        browser.js("document.getElementById('signout').click()")
        s = wait_for("the prompt after Sign out", lambda: prompt_up(state()), timeout, show=state)
        got = pods()
        assert not got, f"rows still drawn after Sign out: {sorted(got)}"
        st = stored()
        assert good_token not in json.dumps(st), f"the token is still stored after Sign out: {list(st['session'])}"
        browser.page("Page.reload", ignoreCache=True)
        wait_for("the prompt after a reload", lambda: prompt_up(state()), timeout, show=state)
        assert not pods(), "rows drawn after a reload once signed out"
        browser.screenshot(os.path.join(out_dir, "webview-signed-out.png"))
        return f"prompt: {s['message']!r}"

    def forbidden():
        answer = server_says(forbidden_token)
        assert answer["status"] == 403, f"the API answers {answer['status']} to the forbidden token, not 403"
        type_token(forbidden_token)
        s = wait_for("the 403 message in the page", lambda: (lambda s: s["noticeKind"] == "forbidden" and s)(state()),
                     timeout, show=state)
        assert not s["prompt"], "the prompt is up for a 403"
        assert error_of(answer) in s["notice"], f"page says {s['notice']!r}, the server {error_of(answer)!r}"
        assert s["signout"], "no Sign out for a signed-in caller"
        assert not pods(), "rows drawn for a caller who may not see them"
        browser.screenshot(os.path.join(out_dir, "webview-forbidden.png"))
        browser.js("document.getElementById('signout').click()")
        wait_for("the prompt after Sign out", lambda: prompt_up(state()), timeout)
        return f"notice: {s['notice']!r}"

    steps = [
        ("web view without a token: the sign-in prompt (password field) with the server's 401 message, no rows", no_token),
        ("web view, a bad token: the prompt stays with the server's rejection; the token is not kept", bad),
        ("web view, the good token: rows of the expected pods, none of the forbidden ones", good),
        ("web view: the token only in sessionStorage (not localStorage, cookies, URL); sent as X-Kai-Authorization, the event stream too",
         storage),
    ]
    if change is not None:
        steps.append(("web view: a change in the cluster shows without a reload over the token's event stream", live_change))
    steps.append(("web view: a reload keeps the tab signed in", reload_keeps))
    steps.append(("web view: Sign out brings the prompt back, clears the rows and the token", sign_out))
    if forbidden_token:
        steps.append(("web view, a token that may see nothing: the server's 403 message in the page, no prompt, no rows",
                      forbidden))

    try:
        browser = DevTools(profile, os.path.join(out_dir, "chromium-webview-auth.log"), chromium, extra)
        browser.page("Network.enable")
        browser.page("Page.enable")
        # The protocol's events of a page that loads a large model pile up
        # only as the few kept kinds above.
        for i, (name, fn) in enumerate(steps):
            try:
                detail = fn()
                results.append((name, True, detail or ""))
            except (AssertionError, OSError) as e:
                results.append((name, False, str(e)))
                try:
                    browser.screenshot(os.path.join(out_dir, f"webview-auth-failed-{i + 1}.png"))
                except (AssertionError, OSError):
                    pass
                results.extend((n, False, f"not run: {name!r} failed") for n, _ in steps[i + 1:])
                break
    except (AssertionError, OSError) as e:
        results.append(("web view: headless Chromium over the DevTools pipe", False, str(e)))
    finally:
        if browser is not None:
            browser.close()
        # The profile may hold the session's storage on disk: the token.
        shutil.rmtree(profile, ignore_errors=True)
    return results


def _token(arg):
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            return f.read().strip()
    return arg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the web view (the aggregator's / or the service-proxy path ending in /)")
    p.add_argument("good_token", help="a token that may see the --expect pods (@FILE reads it from FILE)")
    p.add_argument("bad_token", help="a token the API server rejects (@FILE reads it from FILE)")
    p.add_argument("--expect", action="append", default=[], metavar="POD", help="a pod that must have a row")
    p.add_argument("--forbid", action="append", default=[], metavar="POD", help="a pod that must not")
    p.add_argument("--forbidden-token", help="a token that may see nothing (403; @FILE reads it from FILE)")
    p.add_argument("--out", default="webview-auth-out", help="screenshots and chromium's log (default: %(default)s)")
    p.add_argument("--insecure", action="store_true", help="accept any TLS certificate")
    p.add_argument("--timeout", type=float, default=WAIT, help="seconds per awaited condition")
    a = p.parse_args(argv)
    results = check_token_prompt(a.url, _token(a.good_token), _token(a.bad_token), a.expect, a.forbid, a.out,
                                 forbidden_token=_token(a.forbidden_token) if a.forbidden_token else None,
                                 ignore_certificate_errors=a.insecure, timeout=a.timeout)
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"\n{len(results) - failed} passed, {failed} failed (output under {a.out})")
    return min(failed, 100)


if __name__ == "__main__":
    sys.exit(main())
