/* The course's own script, added to every page by jupyter-book (any .js file in _static/ is).
 *
 * Search summaries in plain text. Sphinx's search page fetches each page it found and shows a few
 * lines of its text; a page's formulas are still TeX there (MathJax typesets only the page you read),
 * so a summary would read "\(i\) ... \(0..i\)". Before Sphinx takes the text, each formula becomes
 * plain text: delimiters dropped, the commands the chapters use written as their symbols.
 * tests/test_course_browser.py searches the book over HTTP and reads the summaries. */
(function () {
  "use strict";
  var SYMBOLS = {
    times: "×", cdot: "·", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈",
    lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉", ldots: "…", dots: "…", cdots: "⋯",
    to: "→", rightarrow: "→", leftarrow: "←", infty: "∞", sum: "Σ", alpha: "α", beta: "β",
    gamma: "γ", delta: "δ", epsilon: "ε", lambda: "λ", mu: "μ", sigma: "σ", tau: "τ", pi: "π",
    bmod: "mod", mod: "mod", log: "log", exp: "exp", max: "max", min: "min", sqrt: "√",
    quad: " ", qquad: " ", ",": " ", ";": " ", "!": "", " ": " ", "{": "{", "}": "}", "_": "_",
    "%": "%", "$": "$", "#": "#", "&": "&"
  };

  /* A formula's TeX as the plain text a reader would say: '\lfloor p/bs \rfloor' -> '⌊p/bs⌋'. */
  function texToText(tex) {
    var text = tex.trim().replace(/^(\\\(|\\\[|\$\$?)/, "").replace(/(\\\)|\\\]|\$\$?)$/, "");
    text = text.replace(/\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)");
    text = text.replace(/\\(?:text|mathrm|mathbf|mathit|operatorname|textrm|texttt|mathtt)\s*\{([^{}]*)\}/g, "$1");
    text = text.replace(/\\(left|right|big|Big|bigg|Bigg)\b\s*/g, "");
    text = text.replace(/\\([A-Za-z]+|.)\s?/g, function (whole, name) {
      return Object.prototype.hasOwnProperty.call(SYMBOLS, name) ? SYMBOLS[name] : name;
    });
    return text.replace(/[{}]/g, "").replace(/\s+/g, " ").trim();
  }

  /* The page's HTML with every formula (span or div of class "math") written as plain text. */
  function plainMath(htmlString) {
    var page = new DOMParser().parseFromString(htmlString, "text/html");
    page.querySelectorAll(".math").forEach(function (formula) {
      formula.textContent = texToText(formula.textContent);
    });
    return page.documentElement.outerHTML;
  }

  /* Wrap Sphinx's Search.htmlToText (searchtools.js, loaded on the search page only, before or after
   * this script; its search starts when the page has loaded, after this). */
  function wrapSearch() {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.courseTextPlain) return;
    var htmlToText = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      return htmlToText(plainMath(htmlString), anchor);
    };
    Search.courseTextPlain = true;
  }

  /* An inline formula wider than its paragraph (a phone's column is narrow) becomes a box of its own
   * that scrolls (course.css), so the page never does. */
  function boxWideInlineMath() {
    document.querySelectorAll("mjx-container:not([display='true'])").forEach(function (formula) {
      var room = formula.parentElement && formula.closest("p, li, td, dd, div");
      formula.classList.remove("course-wide-math");
      if (room && formula.getBoundingClientRect().width > room.clientWidth) formula.classList.add("course-wide-math");
    });
  }

  /* The pieces of a formula's TeX between its top-level \qquad's (outside braces, \left...\right and
   * environments): where a displayed formula may be broken into lines. */
  function topLevelParts(tex) {
    var parts = [], depth = 0, start = 0, i = 0;
    while (i < tex.length) {
      if (tex[i] === "\\") {
        var command = /^\\([A-Za-z]+)/.exec(tex.slice(i));
        var name = command ? command[1] : "";
        if (name === "begin" || name === "left") depth++;
        else if (name === "end" || name === "right") depth--;
        else if (name === "qquad" && depth === 0) {
          parts.push(tex.slice(start, i));
          start = i + command[0].length;
        }
        i += command ? command[0].length : 2;
        continue;
      }
      if (tex[i] === "{") depth++;
      else if (tex[i] === "}") depth--;
      i++;
    }
    parts.push(tex.slice(start));
    return parts.map(function (part) { return part.trim(); }).filter(Boolean);
  }

  /* Set a displayed formula's size to fit its column, down to `least` percent of the text's size
   * (MathJax sets math larger than the text, to match its letters' height); true if it fits. The whole
   * formula's natural width is kept (data-course-natural-px). */
  function scaleToFit(box, least) {
    var formula = box.querySelector("mjx-container[display='true']");
    var math = formula && formula.querySelector("mjx-math");
    if (!math) return true;
    if (!formula.dataset.courseFont) formula.dataset.courseFont = String(parseFloat(formula.style.fontSize) || 100);
    var size = parseFloat(formula.dataset.courseFont);
    formula.style.fontSize = size + "%";
    var natural = math.getBoundingClientRect().width;
    if (box.dataset.courseBroken !== "1") box.dataset.courseNaturalPx = String(natural);
    var scale = formula.clientWidth / natural;
    if (scale < 1) formula.style.fontSize = Math.min(size, Math.max(size * scale * 0.98, least)) + "%";
    return math.getBoundingClientRect().width <= formula.clientWidth + 0.5;
  }

  // The smallest a displayed formula is set, and the size below which one is broken into lines first
  // (percent of the text's size).
  var LEAST = 70, BREAK_BELOW = 100;

  /* Typeset a displayed formula's box again from new TeX. */
  function typesetAgain(box, tex) {
    MathJax.typesetClear([box]);
    box.textContent = "\\[" + tex + "\\]";
    return MathJax.typesetPromise([box]);
  }

  /* A displayed formula fits its column, on a phone and in print: one a little too wide is set smaller
   * (down to the text's size, or 70% of it if it cannot be broken); one still too wide is set again
   * broken into lines at its top-level \qquad's, one piece a line (MathJax 3 does not break lines
   * itself), smaller too if need be (down to 70%), and set back whole where the column is wide enough
   * again. */
  function fitDisplay(box) {
    var items = MathJax.startup.document.getMathItemsWithin(box);
    if (!items.length) return Promise.resolve();
    box.dataset.courseTex = box.dataset.courseTex || items[0].math;  // the formula as the chapter wrote it
    var whole = box.dataset.courseTex, parts = topLevelParts(whole);
    box.dataset.courseBroken = items[0].math === whole ? "0" : "1";
    if (box.dataset.courseBroken === "1") {
      // set back whole where the whole fits at the text's size
      var formula = box.querySelector("mjx-container[display='true']");
      var size = (formula && parseFloat(formula.dataset.courseFont)) || 100;
      var room = formula ? formula.clientWidth : 0;
      if (room < parseFloat(box.dataset.courseNaturalPx) * BREAK_BELOW / size) {
        return Promise.resolve(scaleToFit(box, LEAST));
      }
      return typesetAgain(box, whole).then(function () { return fitDisplay(box); });
    }
    if (parts.length < 2) return Promise.resolve(scaleToFit(box, LEAST));
    if (scaleToFit(box, BREAK_BELOW)) return Promise.resolve();
    var lines = "\\begin{gathered}" + parts.join(" \\\\ ") + "\\end{gathered}";
    return typesetAgain(box, lines).then(function () {
      box.dataset.courseBroken = "1";
      scaleToFit(box, LEAST);
    });
  }

  /* Fit every displayed formula, one after the other (MathJax typesets one call at a time). */
  function fitMath() {
    boxWideInlineMath();
    var boxes = Array.from(document.querySelectorAll("div.math")).filter(function (box) {
      return box.querySelector("mjx-container[display='true']");
    });
    return boxes.reduce(function (done, box) {
      return done.then(function () { return fitDisplay(box); });
    }, Promise.resolve()).then(boxWideInlineMath);
  }

  /* window.courseMathReady: settles once every formula is typeset and fitted (engine/course/authoring/book.py
   * waits for it before it prints or measures). */
  var fitting = Promise.resolve();
  function refit() {
    fitting = fitting.then(fitMath, fitMath);
    window.courseMathReady = fitting;
    return fitting;
  }

  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      window.courseMathReady = MathJax.startup.promise.then(refit);
    }
  }

  window.addEventListener("load", whenTypeset);
  window.addEventListener("resize", refit);
  window.courseTexToText = texToText;
  wrapSearch();
  document.addEventListener("DOMContentLoaded", wrapSearch);
})();
