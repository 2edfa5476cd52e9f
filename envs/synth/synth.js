/* Synthetic GUI tasks ("synth/<kind>") on MiniWoB's core.js; see envs/synth/__init__.py.

   genProblem() builds one random page in #area (160x160 CSS px below the 50 px #query bar) for
   SYNTH_KIND. Every random choice comes from Math.random, which the env seeds with
   Math.seedrandom(seed) before core.startEpisodeReal(), so one seed gives one page.
   core.getUtterance() returns {utterance, fields}: the instruction and the instance's named
   values (what the instruction says, never the answer of a kind that must be read off the page).
   The page ends the episode itself: core.endEpisode(+1 | -1, reward > 0, reason).
*/
var SYN = {utterance: '', fields: {}};

// ------------------------------------------------------------------ vocabulary (all generated)
SYN.ONSETS = ['b', 'c', 'd', 'f', 'g', 'h', 'j', 'k', 'l', 'm', 'n', 'p', 'r', 's', 't', 'v', 'w', 'z',
              'br', 'tr', 'st', 'ch', 'sh', 'pl', 'gr', 'kl', 'dr', 'qu', 'x', 'y'];
SYN.VOWELS = ['a', 'e', 'i', 'o', 'u', 'a', 'e', 'i', 'o', 'u', 'ai', 'ou', 'ea', 'io', 'y'];
SYN.CODAS = ['n', 'r', 's', 'l', 'x', 'm', 'k', 't', 'nd', 'st'];
// Common button verbs: half of the buttons of fill/read/option pages; the other half get generated words.
SYN.VERBS = ['Submit', 'OK', 'Save', 'Go', 'Send', 'Done', 'Next', 'Apply', 'Confirm', 'Continue', 'Add',
             'Enter', 'Search', 'Update', 'Finish', 'Store', 'Post', 'Accept'];
// Ids the page (or core.js) already uses: a generated field must not take them.
SYN.RESERVED = {wrap: 1, query: 1, area: 1, marked: 1, 'reward-display': 1, 'reward-last': 1, 'reward-avg': 1,
                'timer-countdown': 1, 'episode-id': 1, 'click-canvas': 1, 'sync-task-cover': 1};

SYN.r = function (lo, hi) { return core.randi(lo, hi + 1); };  // inclusive
SYN.pick = function (a) { return a[core.randi(0, a.length)]; };
SYN.chance = function (p) { return Math.random() < p; };
SYN.cap = function (s) { return s.charAt(0).toUpperCase() + s.slice(1); };

SYN.word = function (lo, hi) {
  var n = SYN.r(lo, hi), s = '';
  for (var i = 0; i < n; i++) {
    if (!(i === 0 && SYN.chance(0.15))) s += SYN.pick(SYN.ONSETS);
    s += SYN.pick(SYN.VOWELS);
    if (SYN.chance(0.2)) s += SYN.pick(SYN.CODAS);
  }
  return s;
};
SYN.letters = function (lo, hi) {
  var n = SYN.r(lo, hi), s = '', upper = SYN.r(0, 2) * 0.3;  // all lower, some upper, many upper
  for (var i = 0; i < n; i++) {
    var c = String.fromCharCode(97 + core.randi(0, 26));
    s += SYN.chance(upper) ? c.toUpperCase() : c;
  }
  return s;
};
SYN.alnum = function (lo, hi) {
  var n = SYN.r(lo, hi), s = '';
  var digit = core.randi(0, n);  // at least one digit
  for (var i = 0; i < n; i++) {
    if (i === digit || SYN.chance(0.3)) s += String(core.randi(0, 10));
    else { var c = String.fromCharCode(97 + core.randi(0, 26)); s += SYN.chance(0.35) ? c.toUpperCase() : c; }
  }
  return s;
};
SYN.number = function () {
  var k = SYN.r(1, 4);
  return String(core.randi(k === 1 ? 0 : Math.pow(10, k - 1), Math.pow(10, k)));
};
// A visible label: buttons, links, texts, options, tabs, marked items.
SYN.label = function () {
  var u = Math.random();
  if (u < 0.28) return SYN.cap(SYN.word(2, 3));
  if (u < 0.42) return SYN.word(1, 3);
  if (u < 0.56) return SYN.word(1, 2) + ' ' + SYN.number();
  if (u < 0.68) return SYN.cap(SYN.word(1, 2)) + ' ' + SYN.word(1, 2);
  if (u < 0.82) return SYN.letters(3, 6);
  if (u < 0.92) return SYN.alnum(3, 5);
  return SYN.number();
};
// A numbered series: one short generated prefix, a separator, then numbers ("Vo 3", "Kra #12", "Ti-7"). On a page in
// series mode every visible label is drawn from it, so labels differ only in their numbers and matching the
// instruction's label means reading each one to the last character (click, tabs and search pages, a quarter of them).
SYN.series = function () {
  var pre = SYN.cap(SYN.word(1, 1)).slice(0, 4), sep = SYN.pick([' ', ' #', '-', ' ']), hi = SYN.pick([30, 99]);
  return function () { return pre + sep + SYN.r(1, hi); };
};
SYN.SERIES_KINDS = {click: 1, tabs: 1, search: 1};
// A value to type.
SYN.value = function () {
  var u = Math.random();
  if (u < 0.3) return SYN.letters(3, 8);
  if (u < 0.5) return SYN.alnum(2, 6);
  if (u < 0.7) return SYN.word(1, 3);
  if (u < 0.8) return SYN.cap(SYN.word(1, 3));
  if (u < 0.9) return SYN.cap(SYN.word(1, 2)) + ' ' + SYN.number();
  return SYN.number();
};
SYN.fieldName = function () {
  return SYN.chance(0.2) ? SYN.cap(SYN.word(1, 2)) + ' ' + SYN.word(1, 2) : SYN.cap(SYN.word(1, 3));
};
// The DOM id of a field (`input_text#tami_vos` in the UI text); agents/teacher_synth.py derives it the same way.
SYN.fieldId = function (name) { return name.toLowerCase().replace(/[^a-z0-9]+/g, '_').replace(/^_+|_+$/g, ''); };

// Per-problem state: labels already on the page (case-insensitive), button verbs used bare.
SYN.State = function () { this.used = {}; this.verb = {}; this.series = null; };
SYN.State.prototype.fresh = function (gen, maxLen) {
  maxLen = maxLen || 12;
  // a page in series mode draws its labels from the series first, then from gen once the series runs dry
  var gens = this.series && (gen === SYN.label || gen === SYN.tabLabel) ? [this.series, gen] : [gen];
  for (var g = 0; g < gens.length; g++) {
    for (var i = 0; i < 200; i++) {
      var s = gens[g](), k = s.toLowerCase();
      if (s.length >= 2 && s.length <= maxLen && !this.used[k]) { this.used[k] = 1; return s; }
    }
  }
  throw new Error('synth: no fresh label');
};
SYN.State.prototype.field = function () {
  for (var i = 0; i < 200; i++) {
    var s = SYN.fieldName(), id = SYN.fieldId(s);
    if (s.length >= 2 && s.length <= 11 && id && !SYN.RESERVED[id] && !this.used[s.toLowerCase()] && !this.used['#' + id]) {
      this.used[s.toLowerCase()] = 1; this.used['#' + id] = 1; return s;
    }
  }
  throw new Error('synth: no fresh field name');
};
SYN.State.prototype.buttonLabel = function () {
  if (SYN.chance(0.5)) {
    for (var i = 0; i < 20; i++) {
      var v = SYN.pick(SYN.VERBS);
      if (!this.used[v.toLowerCase()]) { this.used[v.toLowerCase()] = 1; this.verb[v] = 1; return v; }
    }
  }
  return this.fresh(function () { return SYN.cap(SYN.word(1, 3)); }, 9);
};
// How an instruction names a button: a verb bare (press Save), a generated label quoted (press "Qazor").
SYN.State.prototype.bname = function (label) { return this.verb[label] ? label : SYN.q(label); };

SYN.q = function (s) { return '"' + s + '"'; };
SYN.fmt = function (tpl, v) { return tpl.replace(/\{(\w+)\}/g, function (m, k) { return v[k]; }); };

// ------------------------------------------------------------------ elements
SYN.el = function (tag, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  e.className = 'syn' + (cls ? ' ' + cls : '');
  e.style.fontSize = SYN.r(10, 14) + 'px';
  return e;
};
SYN.button = function (text) {
  var b = SYN.el('button', text);
  b.style.padding = SYN.r(1, 4) + 'px ' + SYN.r(3, 9) + 'px';
  return b;
};
SYN.link = function (text) {
  var a = SYN.el('a', text);
  a.href = '#';
  a.addEventListener('click', function (ev) { ev.preventDefault(); });
  return a;
};
SYN.TEXT_COLORS = ['#000', '#222', '#444', '#333', '#050', '#500', '#006'];
SYN.text = function (text) {
  var s = SYN.el('span', text);
  s.style.color = SYN.pick(SYN.TEXT_COLORS);
  if (SYN.chance(0.25)) s.style.fontWeight = 'bold';
  return s;
};
SYN.field = function (name) {
  var id = SYN.fieldId(name);
  var g = SYN.el('div', undefined, 'fld');
  var lab = document.createElement('label');
  lab.textContent = name;
  lab.htmlFor = id;
  var inp = document.createElement('input');
  inp.type = 'text'; inp.id = id; inp.autocomplete = 'off'; inp.spellcheck = false;
  inp.style.width = SYN.r(45, 80) + 'px';
  inp.style.fontSize = SYN.r(10, 12) + 'px';
  if (SYN.chance(0.5)) {  // label above the input (its box only as wide as its text)
    lab.style.display = 'block'; lab.style.width = 'fit-content'; inp.style.display = 'block'; inp.style.marginTop = '1px';
  }
  else { lab.style.marginRight = SYN.r(2, 6) + 'px'; }
  g.appendChild(lab); g.appendChild(inp);
  g.input = inp; g.label = name;
  return g;
};
SYN.option = function (type, group, text) {
  var l = SYN.el('label', undefined, 'opt');
  var i = document.createElement('input');
  i.type = type; i.name = group;
  l.appendChild(i);
  l.appendChild(document.createTextNode(' ' + text));
  l.input = i; l.label = text;
  return l;
};
// A distractor of one of `types`; a button or link ends the episode with -1 when clicked.
SYN.distractor = function (S, types) {
  var t = SYN.pick(types), e;
  if (t === 'field') return SYN.field(S.field());
  var label = S.fresh(SYN.label);
  if (t === 'text') return SYN.text(label);
  e = t === 'button' ? SYN.button(label) : SYN.link(label);
  SYN.wrong(e, (t === 'button' ? 'pressed the button ' : 'clicked the link ') + SYN.q(label));
  return e;
};
SYN.wrong = function (e, reason) {
  e.addEventListener('click', function () { core.endEpisode(-1, false, reason + ', which the task did not ask for'); });
};

// ------------------------------------------------------------------ layouts
SYN.W = 160; SYN.H = 160; SYN.M = 2; SYN.GAP = 3;

// Absolute positions drawn uniformly over the box, overlaps (with a gap) rejected.
SYN.scatter = function (box, nodes, W, H, M) {
  box.innerHTML = '';
  var placed = [], G = SYN.GAP;
  for (var i = 0; i < nodes.length; i++) {
    var n = nodes[i];
    n.style.position = 'absolute'; n.style.left = '0px'; n.style.top = '0px'; n.style.margin = '0px';
    n.style.display = '';
    box.appendChild(n);
    var r = n.getBoundingClientRect(), w = Math.ceil(r.width), h = Math.ceil(r.height);
    if (w > W - 2 * M || h > H - 2 * M) return false;
    var ok = false, x = 0, y = 0;
    for (var t = 0; t < 80 && !ok; t++) {
      x = SYN.r(M, W - M - w); y = SYN.r(M, H - M - h);
      ok = placed.every(function (p) {
        return x >= p.x + p.w + G || p.x >= x + w + G || y >= p.y + p.h + G || p.y >= y + h + G;
      });
    }
    if (!ok) return false;
    n.style.left = x + 'px'; n.style.top = y + 'px';
    placed.push({x: x, y: y, w: w, h: h});
  }
  return true;
};
// Inline flow (wrapping rows, random alignment and margins) in a box at a random height.
SYN.flow = function (area, nodes) {
  area.innerHTML = '';
  var box = document.createElement('div');
  box.style.position = 'absolute'; box.style.left = SYN.M + 'px'; box.style.top = '0px';
  box.style.width = (SYN.W - 2 * SYN.M) + 'px';
  box.style.textAlign = SYN.pick(['left', 'center', 'right']);
  area.appendChild(box);
  var mv = SYN.r(2, 6), mh = SYN.r(2, 8);
  nodes.forEach(function (n) {
    n.style.position = 'static'; n.style.display = 'inline-block'; n.style.verticalAlign = 'middle';
    n.style.margin = mv + 'px ' + mh + 'px';
    box.appendChild(n);
  });
  var h = Math.ceil(box.getBoundingClientRect().height);
  if (h > SYN.H - 2 * SYN.M) return false;
  for (var i = 0; i < nodes.length; i++) {
    if (nodes[i].getBoundingClientRect().width > SYN.W - 2 * SYN.M - 2 * mh) return false;
  }
  box.style.top = SYN.r(SYN.M, SYN.H - SYN.M - h) + 'px';
  return true;
};
// A document from the top-left, as most web pages and forms are laid out: texts and fields are blocks (a line each),
// buttons and links run inline and sometimes end their line. Many elements share the left edge and a row of buttons
// shares its y, so the element a label names must be told from its neighbours by the label, not by where it is.
SYN.doc = function (area, nodes) {
  area.innerHTML = '';
  var box = document.createElement('div'), inner = SYN.W - 2 * SYN.M;
  box.style.position = 'absolute'; box.style.left = SYN.M + 'px'; box.style.top = '0px';
  box.style.width = inner + 'px';
  box.style.textAlign = SYN.chance(0.8) ? 'left' : 'center';
  area.appendChild(box);
  var mv = SYN.r(0, 4), mh = SYN.r(0, 6), breakP = SYN.pick([0.2, 0.5, 0.8]);
  nodes.forEach(function (n) {
    var inline = n.tagName === 'BUTTON' || n.tagName === 'A';
    n.style.position = 'static'; n.style.verticalAlign = 'middle';
    n.style.display = inline ? 'inline-block' : 'block';
    n.style.margin = mv + 'px ' + (inline ? mh : 0) + 'px';
    box.appendChild(n);
    if (inline && SYN.chance(breakP)) box.appendChild(document.createElement('br'));
  });
  var h = Math.ceil(box.getBoundingClientRect().height);
  if (h > SYN.H - 2 * SYN.M) return false;
  for (var i = 0; i < nodes.length; i++) {  // an inline element wider than a line would overflow it
    if (nodes[i].style.display === 'inline-block' && nodes[i].getBoundingClientRect().width > inner - 2 * mh) return false;
  }
  box.style.top = SYN.r(SYN.M, Math.min(SYN.M + 24, SYN.H - SYN.M - h)) + 'px';
  return true;
};
// One draw picks the layout: a flow a quarter of the time, a document a third, else scattered. A draw that does not
// fit falls back to scattering (and, crowded, to a flow).
SYN.layout = function (area, nodes) {
  core.shuffle(nodes);
  var u = Math.random();
  if (u < 0.25 && SYN.flow(area, nodes)) return true;
  if (u >= 0.25 && u < 0.6 && SYN.doc(area, nodes)) return true;
  for (var k = 0; k < 6; k++) if (SYN.scatter(area, nodes, SYN.W, SYN.H, SYN.M)) return true;
  return SYN.flow(area, nodes);
};

// ------------------------------------------------------------------ kinds
// Each returns {nodes, utterance, fields} (and optionally layout(area) -> bool). `shrink` grows with
// every failed layout, so a crowded draw is redrawn with fewer distractors.
SYN.kinds = {};

SYN.kinds.click = function (S, shrink) {
  var role = SYN.chance(0.5) ? 'button' : 'link';
  var target = S.fresh(SYN.label);
  var t = role === 'button' ? SYN.button(target) : SYN.link(target);
  t.addEventListener('click', function () { core.endEpisode(1, true); });
  var nodes = [t], n = Math.max(2, SYN.r(2, 7) - shrink);
  for (var i = 0; i < n; i++) nodes.push(SYN.distractor(S, ['button', 'button', 'link', 'link', 'text', 'text', 'field']));
  var tpl = role === 'button'
    ? SYN.pick(['Click the button {t}.', 'Click on the {t} button.', 'Press the {t} button.',
                'Find the button labelled {t} and click it.', 'Click {t}.'])
    : SYN.pick(['Click the link {t}.', 'Click on the {t} link.', 'Follow the link {t}.', 'Open the link {t}.']);
  return {nodes: nodes, utterance: SYN.fmt(tpl, {t: SYN.q(target)}),
          fields: {kind: 'click', role: role, target: target}};
};

// Fill `nTargets` of `nFields` labelled fields, then press the button.
SYN.fillKind = function (S, shrink, kind, nTargets, nFields) {
  var groups = [], i;
  for (i = 0; i < nFields; i++) groups.push(SYN.field(S.field()));
  var want = [];
  for (i = 0; i < nTargets; i++) want.push(S.fresh(SYN.value));
  var bl = S.buttonLabel(), btn = SYN.button(bl);
  btn.addEventListener('click', function () {
    for (var j = 0; j < groups.length; j++) {
      var exp = j < nTargets ? want[j] : '', got = groups[j].input.value;
      if (got !== exp) {
        return core.endEpisode(-1, false, 'pressed ' + SYN.q(bl) + ' with ' + groups[j].label + ' = ' + SYN.q(got) +
                               ' (the task wanted ' + SYN.q(exp) + ')');
      }
    }
    core.endEpisode(1, true);
  });
  var nodes = groups.concat([btn]);
  var nd = Math.max(0, Math.min(SYN.r(Math.max(0, 2 - nFields), 3), 7 - nFields) - shrink);
  for (i = 0; i < nd; i++) nodes.push(SYN.distractor(S, ['text', 'text', 'link', 'button']));
  var fields = {kind: kind}, v = {b: S.bname(bl)};
  for (i = 0; i < nTargets; i++) {
    fields['field_' + (i + 1)] = groups[i].label; fields['text_' + (i + 1)] = want[i];
    v['f' + (i + 1)] = groups[i].label; v['v' + (i + 1)] = SYN.q(want[i]);
  }
  fields.button = bl;
  var tpl = nTargets === 1
    ? SYN.pick(['Enter {v1} into the {f1} field and press {b}.', 'Type {v1} in the {f1} box, then click {b}.',
                'Fill in {f1} with {v1} and press {b}.', 'Put {v1} in the {f1} field, then press {b}.'])
    : SYN.pick(['Enter {v1} as {f1} and {v2} as {f2}, then press {b}.',
                'Fill {f1} with {v1} and {f2} with {v2}, then press {b}.',
                'Type {v1} into {f1} and {v2} into {f2}, then click {b}.',
                'Set {f1} to {v1} and {f2} to {v2} and press {b}.']);
  return {nodes: nodes, utterance: SYN.fmt(tpl, v), fields: fields};
};
SYN.kinds.type = function (S, shrink) { return SYN.fillKind(S, shrink, 'type', 1, SYN.r(1, 3)); };
SYN.kinds.form = function (S, shrink) { return SYN.fillKind(S, shrink, 'form', 2, SYN.r(2, 3)); };

SYN.MARK_BG = ['#ff0', '#ffeb3b', '#fff176'];
SYN.OTHER_BG = ['#cde', '#dfd', '#fdd', '#eee', '#def'];
SYN.kinds.read = function (S, shrink) {
  var text = S.fresh(SYN.label);
  var m = SYN.text(text);
  m.id = 'marked';
  m.style.background = SYN.pick(SYN.MARK_BG);
  m.style.padding = SYN.r(1, 3) + 'px';
  var name = SYN.chance(0.5) && !S.used.answer ? (S.used.answer = S.used['#answer'] = 1, 'Answer') : S.field();
  var g = SYN.field(name);
  var bl = S.buttonLabel(), btn = SYN.button(bl);
  btn.addEventListener('click', function () {
    var got = g.input.value;
    if (got === text) core.endEpisode(1, true);
    else core.endEpisode(-1, false, 'pressed ' + SYN.q(bl) + ' with ' + name + ' = ' + SYN.q(got) +
                         ' (the marked item reads ' + SYN.q(text) + ')');
  });
  var nodes = [m, g, btn], i, n = Math.max(1, SYN.r(1, 4) - shrink);
  for (i = 0; i < n; i++) {
    var d = SYN.text(S.fresh(SYN.label));
    if (SYN.chance(0.3)) { d.style.background = SYN.pick(SYN.OTHER_BG); d.style.padding = SYN.r(1, 3) + 'px'; }
    nodes.push(d);
  }
  if (SYN.chance(0.3) && !shrink) nodes.push(SYN.distractor(S, ['button', 'link']));
  var tpl = SYN.pick(['Type the text of the marked item into the {f} field and press {b}.',
                      'Copy the highlighted text into {f}, then press {b}.',
                      'Enter the text shown in yellow into the {f} field and click {b}.',
                      'Read the marked text and type it in {f}, then press {b}.']);
  return {nodes: nodes, utterance: SYN.fmt(tpl, {f: name, b: S.bname(bl)}),
          fields: {kind: 'read', field_1: name, button: bl}};
};

SYN.kinds.option = function (S, shrink) {
  var widget = SYN.chance(0.5) ? 'radio' : 'checkbox';
  var n = Math.max(3, SYN.r(3, 6) - shrink), opts = [], i;
  for (i = 0; i < n; i++) opts.push(SYN.option(widget, 'opt', S.fresh(SYN.label)));
  var nt = widget === 'radio' ? 1 : SYN.r(1, 2), targets = opts.slice(0, nt).map(function (o) { return o.label; });
  var bl = S.buttonLabel(), btn = SYN.button(bl);
  btn.addEventListener('click', function () {
    var bad = opts.filter(function (o) { return o.input.checked !== (targets.indexOf(o.label) >= 0); });
    if (!bad.length) return core.endEpisode(1, true);
    core.endEpisode(-1, false, 'pressed ' + SYN.q(bl) + ' with ' + SYN.q(bad[0].label) +
                    (bad[0].input.checked ? ' selected' : ' not selected'));
  });
  core.shuffle(opts);
  var nodes;
  if (SYN.chance(0.5)) {  // one list
    var list = SYN.el('div', undefined, 'optlist');
    opts.forEach(function (o) { o.style.display = 'block'; o.style.margin = SYN.r(0, 3) + 'px 0px'; list.appendChild(o); });
    nodes = [list, btn];
  } else {
    nodes = opts.concat([btn]);
  }
  if (SYN.chance(0.4) && !shrink) nodes.push(SYN.distractor(S, ['text', 'text', 'button']));
  var v = {t: targets.map(SYN.q).join(' and '), b: S.bname(bl)};
  var tpl = widget === 'radio'
    ? SYN.pick(['Select {t} and press {b}.', 'Choose the option {t}, then click {b}.', 'Pick {t} and press {b}.'])
    : SYN.pick(['Check {t}, then press {b}.', 'Tick the ' + (nt > 1 ? 'boxes' : 'box') + ' {t} and press {b}.',
                'Select {t} and press {b}.']);
  var fields = {kind: 'option', widget: widget, button: bl};
  targets.forEach(function (t, j) { fields['target_' + (j + 1)] = t; });
  return {nodes: nodes, utterance: SYN.fmt(tpl, v), fields: fields};
};

// A tab bar over one panel per tab; panel k holds the links links[k], scattered. Returns a layout(area) for
// SYN.kinds.*: the bar at a random spot near the top, tab `start` active; clicking a tab shows its panel.
SYN.tabPage = function (tabs, links, start) {
  var panels = [];
  var activate = function (k) {
    tabs.forEach(function (t, m) { t.className = 'syn tab' + (m === k ? ' active' : ''); });
    panels.forEach(function (p, m) { p.style.display = m === k ? 'block' : 'none'; });
  };
  tabs.forEach(function (t, k) { t.addEventListener('click', function () { activate(k); }); });
  var fsize = SYN.r(10, 13) + 'px';
  tabs.forEach(function (t) { t.style.fontSize = fsize; });
  return function (area) {
    area.innerHTML = '';
    panels.length = 0;
    var bar = document.createElement('div');
    bar.style.position = 'absolute'; bar.style.whiteSpace = 'nowrap';
    tabs.forEach(function (t) { bar.appendChild(t); });
    area.appendChild(bar);
    var br = bar.getBoundingClientRect(), bw = Math.ceil(br.width), bh = Math.ceil(br.height);
    if (bw > SYN.W - 2 * SYN.M - 4) return false;
    var bx = SYN.r(SYN.M + 2, SYN.W - SYN.M - 2 - bw), by = SYN.r(SYN.M, 30);
    bar.style.left = bx + 'px'; bar.style.top = by + 'px';
    var pt = by + bh, pw = SYN.W - 2 * SYN.M - 2, ph = SYN.H - SYN.M - pt - 2;
    for (var k = 0; k < tabs.length; k++) {
      var p = document.createElement('div');
      p.className = 'panel';
      p.style.left = SYN.M + 'px'; p.style.top = pt + 'px'; p.style.width = pw + 'px'; p.style.height = ph + 'px';
      area.appendChild(p);
      panels.push(p);
      core.shuffle(links[k]);
      var ok = false;
      for (var a = 0; a < 6 && !ok; a++) ok = SYN.scatter(p, links[k], pw, ph, 3);
      if (!ok) return false;
    }
    activate(start);
    return true;
  };
};
SYN.tabLabel = function () { return SYN.chance(0.6) ? SYN.cap(SYN.word(1, 2)) : SYN.label(); };
SYN.tabEl = function (S) {
  var tl = S.fresh(SYN.tabLabel, 8);
  var tab = SYN.el('div', tl, 'tab');
  tab.label = tl;
  return tab;
};
// A link that ends the episode: +1 for the target, -1 (with the reason) for any other.
SYN.tabLink = function (label, isTarget) {
  var a = SYN.link(label);
  if (isTarget) a.addEventListener('click', function () { core.endEpisode(1, true); });
  else SYN.wrong(a, 'clicked the link ' + SYN.q(label));
  return a;
};

// Tabs: open tab T (another one starts active), then click link L on it.
SYN.kinds.tabs = function (S, shrink) {
  var nt = Math.max(2, SYN.r(2, 4) - shrink), links = [], i, j;
  var ti = core.randi(0, nt), start = (ti + SYN.r(1, nt - 1)) % nt;
  var tabs = [], target = null;
  for (i = 0; i < nt; i++) {
    tabs.push(SYN.tabEl(S));
    var nl = Math.max(2, SYN.r(2, 4) - shrink), ls = [];
    for (j = 0; j < nl; j++) {
      var ll = S.fresh(SYN.label);
      if (i === ti && j === 0) target = ll;
      ls.push(SYN.tabLink(ll, i === ti && j === 0));
    }
    links.push(ls);
  }
  var tpl = SYN.pick(['Open the {tab} tab and click the link {l}.', 'Go to tab {tab}, then click {l}.',
                      'Switch to the {tab} tab and follow the link {l}.', 'Click the link {l} on tab {tab}.']);
  return {nodes: [], layout: SYN.tabPage(tabs, links, start),
          utterance: SYN.fmt(tpl, {tab: SYN.q(tabs[ti].label), l: SYN.q(target)}),
          fields: {kind: 'tabs', tab: tabs[ti].label, target: target}};
};

// One edit of s (a character replaced, dropped, doubled, or two neighbours swapped), fresh on the page; null if
// none is found. Near-copies are what a reader who does not check every character clicks instead of s.
SYN.nearCopy = function (S, s) {
  for (var t = 0; t < 60; t++) {
    var i = core.randi(0, s.length), c = s.charAt(i), u = Math.random(), out = null;
    if (c === ' ') continue;
    if (u < 0.5) {
      var d = /[0-9]/.test(c) ? String(core.randi(0, 10)) : String.fromCharCode(97 + core.randi(0, 26));
      out = s.slice(0, i) + (c !== c.toLowerCase() ? d.toUpperCase() : d) + s.slice(i + 1);
    } else if (u < 0.7) {
      if (s.length > 3) out = s.slice(0, i) + s.slice(i + 1);
    } else if (u < 0.85) {
      out = s.slice(0, i) + c + s.slice(i);
    } else if (i + 1 < s.length && s.charAt(i + 1) !== ' ' && s.charAt(i + 1) !== c) {
      out = s.slice(0, i) + s.charAt(i + 1) + c + s.slice(i + 2);
    }
    if (out && out.trim() === out && out.indexOf('  ') < 0 && out.length >= 2 && !S.used[out.toLowerCase()]) {
      S.used[out.toLowerCase()] = 1;
      return out;
    }
  }
  return null;
};

// Search: the link L is on one of the tabs, and the instruction does not say which. Any tab may start active
// (L's own included), and one or two near-copies of L (one character off) sit on other tabs, sometimes on L's
// own: the page rewards only reading each tab's links exactly and moving on when L is not among them.
SYN.SEARCH_TEMPLATES = ['Find the link {l} on one of the tabs and click it.', 'The link {l} is on one of the tabs: click it.',
                        'Look through the tabs for the link {l}, then click it.', 'Click the link {l}; it may be on another tab.'];
SYN.kinds.search = function (S, shrink) {
  if (shrink < 6 && SYN.chance(0.5)) return SYN.proseSearch(S, shrink);
  var nt = Math.max(2, SYN.r(2, 4) - (shrink > 3 ? 1 : 0)), links = [], i, j;
  var ti = core.randi(0, nt), start = core.randi(0, nt);
  var tabs = [], target = S.fresh(SYN.label);
  for (i = 0; i < nt; i++) {
    tabs.push(SYN.tabEl(S));
    var nl = Math.max(1, SYN.r(2, 4) - shrink), ls = [];
    if (i === ti) ls.push(SYN.tabLink(target, true));
    for (j = 0; j < nl; j++) ls.push(SYN.tabLink(S.fresh(SYN.label), false));
    links.push(ls);
  }
  var nc = shrink > 5 ? 0 : SYN.r(1, 2);
  for (i = 0; i < nc; i++) {
    var near = SYN.nearCopy(S, target);
    if (!near) continue;
    var k = SYN.chance(0.3) ? ti : (ti + SYN.r(1, nt - 1)) % nt;
    links[k].push(SYN.tabLink(near, false));
  }
  var tpl = SYN.pick(SYN.SEARCH_TEMPLATES);
  return {nodes: [], layout: SYN.tabPage(tabs, links, start), utterance: SYN.fmt(tpl, {l: SYN.q(target)}),
          fields: {kind: 'search', target: target}};
};

// A word of running text: lower or capitalised, sometimes with a trailing comma or full stop.
SYN.proseWord = function () {
  var w = SYN.word(1, 3), u = Math.random();
  if (SYN.chance(0.3)) w = SYN.cap(w);
  return u < 0.15 ? w + '.' : u < 0.25 ? w + ',' : w;
};
// One paragraph of items ({text} or {link, target}): consecutive words share one text node, links sit inline.
SYN.prose = function (items) {
  var p = document.createElement('div'), run = '';
  p.className = 'syn prose';
  p.style.whiteSpace = 'normal';
  p.style.width = SYN.r(90, 140) + 'px';
  p.style.fontSize = SYN.r(10, 12) + 'px';
  var flush = function () { if (run) p.appendChild(document.createTextNode(run)); run = ''; };
  items.forEach(function (it, m) {
    if (m) run += ' ';
    if (it.text !== undefined) { run += it.text; return; }
    flush();
    var a = SYN.tabLink(it.link, !!it.target);
    a.style.fontSize = 'inherit';
    p.appendChild(a);
  });
  flush();
  return p;
};
SYN.insertAt = function (a, x) { a.splice(core.randi(0, a.length + 1), 0, x); };
// Search in running text: each tab holds a paragraph in which some words are links. The target word L is a link
// on one tab; on another (most often the one that starts open) L may stand in the text as a plain word, and
// near-copies of L may be links: only a link whose text is exactly L counts, so the reader checks both the text
// and that it is a link before clicking, and opens the next tab otherwise.
SYN.proseSearch = function (S, shrink) {
  var nt = SYN.r(2, shrink > 2 ? 3 : 4), ti = core.randi(0, nt), start = core.randi(0, nt), i, j;
  var target = S.fresh(SYN.proseWord), tabs = [], items = [];
  var plain = function () {
    for (var t = 0; t < 20; t++) {
      var w = SYN.proseWord();
      if (w.toLowerCase() !== target.toLowerCase()) return w;
    }
    return 'et';
  };
  for (i = 0; i < nt; i++) {
    tabs.push(SYN.tabEl(S));
    var its = [], n = Math.max(6, SYN.r(10, 22) - 2 * shrink);
    for (j = 0; j < n; j++) its.push(SYN.chance(0.25) ? {link: S.fresh(SYN.proseWord)} : {text: plain()});
    items.push(its);
  }
  SYN.insertAt(items[ti], {link: target, target: true});
  var other = function () { return (ti + SYN.r(1, nt - 1)) % nt; };
  if (SYN.chance(0.7)) SYN.insertAt(items[start !== ti && SYN.chance(0.7) ? start : other()], {text: target});
  for (i = SYN.r(0, 2); i > 0; i--) {
    var near = SYN.nearCopy(S, target);
    if (near) SYN.insertAt(items[SYN.chance(0.3) ? ti : other()], {link: near});
  }
  var tpl = SYN.pick(SYN.SEARCH_TEMPLATES);
  return {nodes: [], layout: SYN.tabPage(tabs, items.map(function (its) { return [SYN.prose(its)]; }), start),
          utterance: SYN.fmt(tpl, {l: SYN.q(target)}), fields: {kind: 'search', target: target}};
};

// ------------------------------------------------------------------ MiniWoB hooks
var genProblem = function () {
  var area = document.getElementById('area'), query = document.getElementById('query');
  // One stream per (seed, kind): without this, seed s draws the same words in every kind.
  Math.seedrandom(Math.random().toFixed(12) + '/' + SYNTH_KIND);
  for (var shrink = 0; shrink < 12; shrink++) {
    var S = new SYN.State();
    if (SYN.SERIES_KINDS[SYNTH_KIND] && SYN.chance(0.25)) S.series = SYN.series();
    var p = SYN.kinds[SYNTH_KIND](S, shrink);
    var ok = p.layout ? p.layout(area) : SYN.layout(area, p.nodes);
    if (ok) {
      query.textContent = p.utterance;
      SYN.utterance = p.utterance;
      SYN.fields = p.fields;
      return;
    }
  }
  throw new Error('synth: no layout for ' + SYNTH_KIND);
};

core.getUtterance = function () { return {utterance: SYN.utterance, fields: SYN.fields}; };

window.onload = function () { core.startEpisode(); };
