// The console's additions to the XProf frontend's page, loaded first in its head
// (console/xprof.py).
//
// 1. The Graph Viewer pushes its graph's query onto the server's root path
//    (`history.pushState(null, "", "/graph_viewer?...")`, bypassing the router's base), where
//    a reload or a copied link finds nothing: such a path is put under the page's base (the
//    session's XProf prefix). The router's own paths are already under it.
(() => {
  'use strict';
  const push = history.pushState.bind(history);
  const replace = history.replaceState.bind(history);
  function based(url) {
    // The page's <base>, which its own inline script sets after this script has run.
    const base = new URL(document.baseURI).pathname.replace(/\/$/, '');
    if (typeof url !== 'string' || !url.startsWith('/') || url.startsWith('//')
        || url.startsWith(base + '/') || base === '') {
      return url;
    }
    return base + url;
  }
  history.pushState = (state, title, url) => push(state, title, based(url));
  history.replaceState = (state, title, url) => replace(state, title, based(url));
})();

// 2. The Graph Viewer's graph page runs sandboxed, in an opaque origin
//    (console/xprof_html.py): the frontend cannot read it to see it has loaded, and would
//    show "Loading graph..." over it for ever. The page says so itself, by a message.
(() => {
  'use strict';
  window.addEventListener('message', (e) => {
    const frame = document.getElementById('graph-html');
    if (e.data !== 'mldiag:graph-drawn' || !frame || e.source !== frame.contentWindow) return;
    for (const bar of document.querySelectorAll('graph-viewer .progress-container')) {
      bar.style.display = 'none';
    }
  });
})();

// 3. The XProf frontend loads Google Charts and fonts from Google's servers. Without a route
//    to them (an air-gapped fleet) most of its tools stay blank without a word: this says
//    why, what still works, and where mldiag's own report for the session is. First in the
//    head, so that it sees the loads that fail.
(() => {
  'use strict';
  const CHARTS = /^https:\/\/www\.gstatic\.(com|cn)\/charts\//;
  const FONTS = /^https:\/\/fonts\.(googleapis|gstatic)\.com\//;
  const failed = { charts: false };
  const SETTLE_MS = 3000;
  let shown = null;
  let pending = 0;

  function urlOf(el) {
    return (el && (el.src || el.href)) || '';
  }

  // A resource that fails fires `error` on its element, which does not bubble: caught on the
  // way down.
  window.addEventListener('error', (e) => {
    if (CHARTS.test(urlOf(e.target))) {
      failed.charts = true;
      // Said once the frontend has tried what it tries (www.gstatic.cn after .com, and boots
      // without charts after 2.5 s), not at the first failure.
      schedule();
    }
  }, true);

  function chartsLoaded() {
    return !!(window.google && window.google.charts);
  }

  function item(strong, text) {
    const li = document.createElement('li');
    const b = document.createElement('strong');
    b.textContent = strong;
    li.append(b, ' ' + text);
    return li;
  }

  // Decided once the page has loaded and the frontend had its tries; `data-mldiag-offline`
  // on the root says what was decided ("shown" or "none").
  window.addEventListener('load', schedule);

  // A stylesheet that imports Google's fonts (`@import url(https://fonts.googleapis.com/css2?
  // family=...)`; the console serves the frontend's own, Google Sans Code) keeps the rule when
  // the import fails, with no font face behind it: the families asked for that no face of the
  // page declares are missing.
  function missingFonts() {
    const asked = new Set();
    for (const sheet of document.styleSheets) {
      let rules = [];
      try {
        rules = sheet.cssRules;
      } catch (e) {
        continue; // a style sheet of another origin: not ours to read
      }
      for (const rule of rules) {
        if (rule instanceof CSSImportRule && FONTS.test(rule.href)) {
          for (const family of new URL(rule.href).searchParams.getAll('family')) {
            asked.add(family.split(':')[0]);
          }
        }
      }
    }
    const declared = new Set([...document.fonts].map((f) => f.family.replace(/["']/g, '')));
    return [...asked].filter((family) => !declared.has(family)).sort();
  }

  // Components add their style sheets to the head as they render: checked again after each.
  new MutationObserver(schedule).observe(document.head, { childList: true });

  function schedule() {
    document.documentElement.dataset.mldiagOffline = 'pending';
    clearTimeout(pending);
    pending = setTimeout(update, SETTLE_MS);
  }

  function update() {
    const fonts = missingFonts();
    const charts = failed.charts && !chartsLoaded();
    if (!charts && !fonts.length) {
      if (shown) shown.remove();
      shown = null;
      document.documentElement.dataset.mldiagOffline = 'none';
      return;
    }
    document.documentElement.dataset.mldiagOffline = 'shown';
    const base = location.pathname.split('/xprof/')[0];
    const banner = shown || document.createElement('div');
    banner.id = 'mldiag-offline';
    banner.setAttribute('role', 'status');
    banner.replaceChildren();
    Object.assign(banner.style, {
      position: 'fixed', left: '0', right: '0', bottom: '0', zIndex: '10000',
      background: '#fff8e1', color: '#3e2723', borderTop: '2px solid #f9a825',
      font: '14px/1.4 system-ui, sans-serif', padding: '8px 40px 8px 16px',
    });
    const head = document.createElement('div');
    head.textContent = "XProf could not load what it needs from Google's servers "
        + '(no route to them from this browser):';
    const missing = document.createElement('ul');
    missing.style.margin = '4px 0';
    if (charts) {
      missing.append(item('Google Charts', '(www.gstatic.com/charts) is missing: the '
          + "Overview Page's charts, the Roofline Model, the Memory Profile's timeline and "
          + 'the stats tables (HLO Op Stats, Framework Op Stats, Kernel Stats) stay empty. '
          + 'Its terms do not allow serving it from here.'));
    }
    if (fonts.length) {
      missing.append(item('Fonts', `(fonts.googleapis.com: ${fonts.join(', ')}) are missing: `
          + 'text in them shows in a local font.'));
    }
    const works = document.createElement('div');
    works.append('What works: the Trace Viewer, the Graph Viewer, HLO Op Profile and the '
        + "Memory Viewer. mldiag's own report for this session needs nothing from outside: ");
    const report = document.createElement('a');
    report.href = base + '/report';
    report.textContent = 'the report (summary.html)';
    report.target = '_blank';
    works.append(report, '.');
    const close = document.createElement('button');
    close.type = 'button';
    close.textContent = '×';
    close.title = 'Hide';
    close.setAttribute('aria-label', 'Hide this note');
    Object.assign(close.style, { position: 'absolute', right: '8px', top: '4px',
      border: '0', background: 'none', font: '20px system-ui', cursor: 'pointer' });
    close.addEventListener('click', () => banner.remove());
    banner.append(head, missing, works, close);
    if (!shown) {
      shown = banner;
      (document.body || document.documentElement).append(banner);
    }
  }
})();
