// Answers as formatted text: markdown (markdown-it), code highlighting (highlight.js) and math (KaTeX),
// the same way while an answer streams and after a reload. Exposes window.ChatRender.
//
// Model output is untrusted. Raw HTML in it stays text (markdown-it's html: false); only http(s) and
// mailto links become links, opening in a new tab with no referrer; a markdown image becomes a link to
// it, never an <img> (loading one would tell its server that, and what, the answer says); and the
// final HTML passes DOMPurify, with only what markdown can produce allowed, before it reaches the page.
(function () {
  "use strict";

  const SAFE_URL = /^(?:https?:\/\/|mailto:)/i;

  const md = window.markdownit({html: false, linkify: true, breaks: true});
  md.validateLink = function (url) { return SAFE_URL.test(url.trim()); };
  const KATEX_OPTIONS = {throwOnError: false, trust: false, strict: "ignore", maxSize: 20, maxExpand: 500};
  md.use(window.markdownItKatex, Object.assign({katex: window.katex}, KATEX_OPTIONS));

  // Math between TeX's own delimiters, as many models write it: \(…\) inline, \[…\] displayed. Read
  // before markdown's backslash escapes, which would take `\(` for an escaped bracket and drop the
  // backslash; code spans and blocks are read before either, so theirs stay. A delimiter right after
  // a letter or digit (`items\[0\]`) is the escape it looks like, as `$` after one is not math.
  const AFTER_WORD = /[\p{L}\p{N}_]/u;

  // Where `close` (`\)` or `\]`) ends math opened before `from`: its backslash not itself escaped.
  function closingAt(src, close, from, limit) {
    for (let at = src.indexOf(close, from); at >= 0 && at < limit; at = src.indexOf(close, at + 1)) {
      let backslashes = 0;
      while (src[at - 1 - backslashes] === "\\") backslashes++;
      if (backslashes % 2 === 0) return at;
    }
    return -1;
  }

  md.inline.ruler.before("escape", "math_backslash", function (state, silent) {
    const src = state.src;
    const start = state.pos;
    const open = src[start + 1];
    if (src[start] !== "\\" || (open !== "(" && open !== "[")) return false;
    if (start > 0 && AFTER_WORD.test(src[start - 1])) return false;
    const end = closingAt(src, open === "(" ? "\\)" : "\\]", start + 2, state.posMax - 1);
    if (end < 0 || !src.slice(start + 2, end).trim()) return false;
    if (!silent) {
      const token = state.push(open === "(" ? "math_inline" : "math_display", "math", 0);
      token.markup = "\\" + open;
      token.content = src.slice(start + 2, end);
    }
    state.pos = end + 2;
    return true;
  });

  // A paragraph of its own that opens with \[ and whose last line ends with \]: a math block, as
  // `$$` lines are. Display math holds no blank line.
  md.block.ruler.after("blockquote", "math_block_backslash", function (state, startLine, endLine, silent) {
    if (state.sCount[startLine] - state.blkIndent >= 4) return false;  // indented code
    const begin = state.bMarks[startLine] + state.tShift[startLine];
    if (state.src.slice(begin, begin + 2) !== "\\[") return false;
    const lines = [];
    for (let line = startLine; line < endLine; line++) {
      const from = line === startLine ? begin + 2 : state.bMarks[line] + state.tShift[line];
      const text = state.src.slice(from, state.eMarks[line]);
      if (line > startLine && (!text.trim() || state.sCount[line] < state.blkIndent)) return false;
      const trimmed = text.trimEnd();
      const end = trimmed.endsWith("\\]") ? closingAt(trimmed, "\\]", trimmed.length - 2, trimmed.length) : -1;
      if (end < 0) {
        lines.push(text);
        continue;
      }
      lines.push(trimmed.slice(0, end));
      const content = lines.join("\n").trim();
      if (!content || closingAt(content, "\\]", 0, content.length) >= 0) return false;  // \[a\] b \[c\]: inline
      if (silent) return true;
      const token = state.push("math_block", "math", 0);
      token.block = true;
      token.content = content;
      token.markup = "\\[";
      token.map = [startLine, line + 1];
      state.line = line + 1;
      return true;
    }
    return false;
  }, {alt: ["paragraph", "reference", "blockquote", "list"]});

  // Displayed math within a line of text: KaTeX's display box (a block) in the paragraph.
  md.renderer.rules.math_display = function (tokens, idx) {
    try {
      return window.katex.renderToString(tokens[idx].content, Object.assign({}, KATEX_OPTIONS, {displayMode: true}));
    } catch (error) {
      return '<span class="katex-error">' + md.utils.escapeHtml(tokens[idx].content) + "</span>";
    }
  };

  // A link whose target was refused (markdown-it then gives it an empty href) is shown as its text.
  const renderLinkOpen = md.renderer.rules.link_open || function (tokens, idx, options, env, self) {
    return self.renderToken(tokens, idx, options);
  };
  md.renderer.rules.link_open = function (tokens, idx, options, env, self) {
    if (SAFE_URL.test(tokens[idx].attrGet("href") || "")) return renderLinkOpen(tokens, idx, options, env, self);
    for (let i = idx + 1, depth = 0; i < tokens.length; i++) {
      if (tokens[i].type === "link_open") depth++;
      else if (tokens[i].type === "link_close" && depth-- === 0) { tokens[i].meta = {asText: true}; break; }
    }
    return "";
  };
  md.renderer.rules.link_close = function (tokens, idx, options, env, self) {
    return tokens[idx].meta && tokens[idx].meta.asText ? "" : self.renderToken(tokens, idx, options);
  };

  md.renderer.rules.image = function (tokens, idx, options, env, self) {
    const token = tokens[idx];
    const src = token.attrGet("src") || "";
    const label = self.renderInlineAsText(token.children || [], options, env) || src;
    let depth = 0;  // inside a link, an image is its alt text (a link cannot hold another)
    for (let i = 0; i < idx; i++) depth += tokens[i].type === "link_open" ? 1 : tokens[i].type === "link_close" ? -1 : 0;
    if (depth > 0 || !SAFE_URL.test(src)) return md.utils.escapeHtml(label);
    return '<a class="image-link" href="' + md.utils.escapeHtml(src) + '">' + md.utils.escapeHtml(label) + "</a>";
  };

  function languageOf(info) {
    const name = (info || "").trim().split(/\s+/)[0].toLowerCase();
    return /^[\w+#.-]{1,32}$/.test(name) ? name : "";
  }

  // A code block still being written (env.provisional) is shown plain: highlighting it again on every
  // delta would cost the whole block each time. It is highlighted once, when it is complete.
  md.renderer.rules.fence = function (tokens, idx, options, env) {
    const token = tokens[idx];
    const language = languageOf(token.info);
    const known = language && window.hljs.getLanguage(language);
    const body = known && !env.provisional
      ? window.hljs.highlight(token.content, {language: language, ignoreIllegals: true}).value
      : md.utils.escapeHtml(token.content);
    const classes = "hljs" + (language ? " language-" + language : "");
    return '<pre><code class="' + classes + '">' + body + "</code></pre>\n";
  };

  const purify = window.DOMPurify(window);  // an instance of its own: the hooks below stay here
  const PURIFY_CONFIG = {
    // DOMPurify tests every attribute's value against this, not only URLs: values with no scheme
    // (a width, an SVG path, a list's start) must pass, as in its default, whose other schemes
    // (tel:, ftp:, …) are left out here.
    ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
    FORBID_TAGS: ["img", "image", "picture", "source", "video", "audio", "track", "iframe", "object", "embed",
      "form", "input", "button", "textarea", "select", "style", "link", "meta", "base", "use"],
    FORBID_ATTR: ["style", "srcset", "action", "formaction", "background", "poster"],
    // KaTeX's MathML carries the TeX source in an <annotation>, which DOMPurify removes: its text too,
    // or screen readers would read the formula twice.
    ADD_FORBID_CONTENTS: ["annotation"],
    RETURN_DOM_FRAGMENT: true,
  };
  purify.addHook("afterSanitizeAttributes", function (node) {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });

  // The page's policy refuses style attributes (even parsing one is reported as a violation), and
  // KaTeX positions its glyphs with them, markdown tables align columns with them. So they are renamed
  // before parsing and set through the CSSOM after sanitizing, for known layout properties with plain
  // values only (no url(): nothing can be loaded through them). Only markup has ` style="`: every text
  // and attribute value in the renderers' HTML has its quotes escaped.
  const STYLE_PROPERTY = /^(?:height|width|min-width|max-width|vertical-align|top|bottom|left|right|position|text-align|margin(?:-(?:left|right|top|bottom))?|padding(?:-(?:left|right|top|bottom))?|border(?:-(?:top|bottom|left|right))?-(?:width|style|color)|color|background-color)$/;
  const STYLE_VALUE = /^[-\w.#% ]+$/;

  function applyStyles(root) {
    root.querySelectorAll("[data-style]").forEach(function (el) {
      el.getAttribute("data-style").split(";").forEach(function (declaration) {
        const colon = declaration.indexOf(":");
        if (colon < 0) return;
        const property = declaration.slice(0, colon).trim().toLowerCase();
        const value = declaration.slice(colon + 1).trim();
        if (STYLE_PROPERTY.test(property) && STYLE_VALUE.test(value)) el.style.setProperty(property, value);
      });
      el.removeAttribute("data-style");
    });
  }

  // Every code block gets a header: its language and a Copy button (built here, after sanitizing).
  function addCodeHeaders(root) {
    root.querySelectorAll("pre > code").forEach(function (code) {
      const pre = code.parentNode;
      const match = /(?:^|\s)language-(\S+)/.exec(code.className);
      const block = document.createElement("div");
      block.className = "code-block";
      const header = document.createElement("div");
      header.className = "code-header";
      const label = document.createElement("span");
      label.className = "code-language";
      label.textContent = match ? match[1] : "text";
      const copy = document.createElement("button");
      copy.type = "button";
      copy.className = "code-copy";
      copy.textContent = "Copy";
      header.append(label, copy);
      pre.replaceWith(block);
      block.append(header, pre);
    });
  }

  function renderBlock(tokens, provisional) {
    const html = md.renderer.render(tokens, md.options, {provisional: provisional}).replace(/ style="/g, ' data-style="');
    const fragment = purify.sanitize(html, PURIFY_CONFIG);
    applyStyles(fragment);
    addCodeHeaders(fragment);
    return fragment;
  }

  // The top-level blocks of a parsed answer: each its tokens and the source lines it spans (up to the
  // next block, so text that changes a block, trailing lines included, changes its key).
  function splitBlocks(tokens, lines) {
    const blocks = [];
    let depth = 0;
    tokens.forEach(function (token, i) {
      if (depth === 0 && (token.map || !blocks.length)) {
        blocks.push({from: i, to: i + 1, line: token.map ? token.map[0] : 0});
      }
      blocks[blocks.length - 1].to = i + 1;
      depth += token.nesting;
    });
    blocks.forEach(function (block, i) {
      const end = i + 1 < blocks.length ? blocks[i + 1].line : lines.length;
      block.text = lines.slice(block.line, end).join("\n");
    });
    return blocks;
  }

  const states = new WeakMap();  // content element -> {source, blocks: [{key, nodes}], frame}

  function stateOf(el) {
    let state = states.get(el);
    if (!state) {
      state = {source: "", blocks: [], frame: 0};
      states.set(el, state);
    }
    return state;
  }

  // Render the element's source. Blocks that are not the last one are closed: their markdown cannot
  // change any more, so a block whose text is the one already shown keeps its nodes, and a streamed
  // answer only re-renders its tail. `provisional`: the answer is still growing.
  function draw(el, state, provisional) {
    el.classList.add("markdown");
    const shown = state.blocks.reduce(function (n, b) { return n + b.nodes.length; }, 0);
    if (el.childNodes.length !== shown || (shown && el.firstChild !== state.blocks[0].nodes[0])) {
      el.textContent = "";  // written by something else since (or never drawn): start again
      state.blocks = [];
    }
    const source = state.source.replace(/\r\n?/g, "\n").replace(/\0/g, "\uFFFD");
    const env = {};
    const tokens = md.parse(source, env);
    const references = JSON.stringify(env.references || {});
    const blocks = splitBlocks(tokens, source.split("\n"));
    let same = 0;
    const keys = blocks.map(function (block, i) {
      const last = provisional && i === blocks.length - 1;
      return (last ? "~" : "=") + references + "\n" + block.text;
    });
    while (same < blocks.length && same < state.blocks.length && state.blocks[same].key === keys[same]) same++;
    state.blocks.splice(same).forEach(function (old) {
      old.nodes.forEach(function (node) { node.remove(); });
    });
    for (let i = same; i < blocks.length; i++) {
      const fragment = renderBlock(tokens.slice(blocks[i].from, blocks[i].to), provisional && i === blocks.length - 1);
      state.blocks.push({key: keys[i], nodes: Array.from(fragment.childNodes)});
      el.appendChild(fragment);
    }
  }

  // Streamed text: appended now, drawn at the next frame, so the deltas of one frame cost one render.
  function append(el, text) {
    const state = stateOf(el);
    state.source += text;
    if (!state.frame) {
      state.frame = requestAnimationFrame(function () {
        state.frame = 0;
        draw(el, state, true);
      });
    }
  }

  // The whole answer, drawn now as complete (`text` omitted: what was streamed into it).
  function render(el, text) {
    const state = stateOf(el);
    if (state.frame) cancelAnimationFrame(state.frame);
    state.frame = 0;
    if (typeof text === "string") state.source = text;
    draw(el, state, false);
  }

  // The markdown an element shows (its text until it has been rendered).
  function source(el) {
    const state = states.get(el);
    return state ? state.source : el.textContent;
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    // Plain HTTP off localhost has no clipboard API: the older copy command, from a hidden field.
    const field = document.createElement("textarea");
    field.value = text;
    field.setAttribute("readonly", "");
    field.className = "copy-buffer";
    document.body.appendChild(field);
    field.select();
    const copied = document.execCommand("copy");
    field.remove();
    return copied ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest ? event.target.closest(".markdown .code-copy") : null;
    if (!button) return;
    const code = button.closest(".code-block").querySelector("pre > code");
    copyText(code.textContent).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }, function () {
      button.textContent = "Copy failed";
    });
  });

  window.ChatRender = {append: append, render: render, source: source};
})();
