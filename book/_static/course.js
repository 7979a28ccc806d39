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

  /* An inline formula wider than its paragraph (MathJax 3 cannot break one; a phone's column is
   * narrow) becomes a box of its own that scrolls (course.css), so the page never does. */
  function boxWideMath() {
    document.querySelectorAll("mjx-container:not([display='true'])").forEach(function (formula) {
      var room = formula.parentElement && formula.closest("p, li, td, dd, div");
      formula.classList.remove("course-wide-math");
      if (room && formula.getBoundingClientRect().width > room.clientWidth) formula.classList.add("course-wide-math");
    });
    /* A displayed formula a little too wide is set smaller to fit (down to 70%); wider ones scroll. */
    document.querySelectorAll("mjx-container[display='true']").forEach(function (formula) {
      formula.style.fontSize = "";
      var math = formula.querySelector("mjx-math");
      if (!math) return;
      var scale = formula.clientWidth / math.getBoundingClientRect().width;
      if (scale < 1) formula.style.fontSize = Math.max(scale * 0.98, 0.7) * 100 + "%";
    });
  }

  function whenTypeset() {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(boxWideMath);
  }

  window.addEventListener("load", whenTypeset);
  window.addEventListener("resize", boxWideMath);
  window.courseTexToText = texToText;
  wrapSearch();
  document.addEventListener("DOMContentLoaded", wrapSearch);
})();
