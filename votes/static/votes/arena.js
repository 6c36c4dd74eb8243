// The arena's websocket client. Plain JavaScript, no build step. Frames: docs/protocol.md.
// Model output goes through ArenaMarkdown (markdown.js: rendered, then sanitized), the voter's
// own text through textContent: nothing is ever inserted as HTML as written.
(function () {
  "use strict";

  const SIDES = ["a", "b"];
  // [value, symbol, tooltip's wording, name screen readers hear]
  const RATINGS = [
    ["correct", "✓", "correct", "Correct"],
    ["mistake", "🍄", "a mistake", "Mistake"],
    ["fixed", "🥦", "fixed after a correction", "Fixed"],
    ["garbage", "🔥", "garbage", "Garbage"],
  ];
  const FINISHED = ["done", "stopped", "failed"];
  // What each state of a reply says, besides its look: a badge screen readers read too.
  const STATUS_TEXT = {
    pending: "Waiting for the model…",
    streaming: "Writing…",
    stopped: "Stopped",
    failed: "Failed",
    done: "",
  };
  const WRONG = ["mistake", "garbage"];
  const CHOICES = { a: "A is better", b: "B is better", tie: "Tie", both_bad: "Both are bad" };
  // A reply quiet for this long is checked against the database (its worker may be gone).
  const QUIET_RESYNC_MS = 10000;
  const ROSTER_POLL_MS = 3000;

  const root = document.getElementById("arena");
  const form = document.getElementById("prompt-form");
  const input = document.getElementById("prompt");
  const sendButton = document.getElementById("send");
  const sendOneButtons = Array.from(document.querySelectorAll(".send-one"));
  const stopButton = document.getElementById("stop");
  const targetLine = document.getElementById("target");
  const toBothButton = document.getElementById("to-both");
  const tellButtons = Array.from(document.querySelectorAll(".tell-side"));
  const stopSideButtons = Array.from(document.querySelectorAll(".stop-side"));
  const regenerateButtons = Array.from(document.querySelectorAll(".regenerate"));
  const statusLine = document.getElementById("status");
  const whyLine = document.getElementById("why");
  const voteButtons = Array.from(document.querySelectorAll("#votes button[data-choice]"));
  const voteStage = document.getElementById("vote-stage");
  const yourVotes = document.getElementById("your-votes");
  const endButton = document.getElementById("end");
  const startPanel = document.getElementById("start");
  const taskList = document.getElementById("task-list");
  const taskPanel = document.getElementById("task");
  const suggestions = document.getElementById("suggestions");
  const excludedLine = document.getElementById("excluded");
  const endedNote = document.getElementById("ended-note");
  const shareLine = document.getElementById("share");
  const shareLink = document.getElementById("share-link");
  const votesBox = document.getElementById("votes");
  const pickA = document.getElementById("pick-a");
  const pickB = document.getElementById("pick-b");
  const logs = { a: document.getElementById("log-a"), b: document.getElementById("log-b") };

  let battleId = root.dataset.battle || "";
  // anonymous (the models drawn, named at the reveal), named (picked by the voter) or direct (one).
  const pageMode = root.dataset.mode || "";
  let mode = pageMode || "anonymous";
  let names = null;
  let socket = null;
  // Frames asked for while the socket is still opening (a prompt typed as the page loads, or
  // while it reconnects): sent, in order, once it is open.
  let unsent = [];
  let retryDelay = 500;
  // replies["<turn>:<side>"] = {element, textNode, ratingBar, seq (next expected delta), status, rating}
  let replies = {};
  let latestTurn = -1;
  let lastTurnOf = { a: -1, b: -1 };
  let votes = {};
  let ended = false;
  let task = null;
  let scriptedSent = { a: 0, b: 0 };
  let lastFrameAt = Date.now();
  // A prompt sent and not yet accepted stays in the box: the server may refuse it.
  let sentPrompt = null;
  // Where Enter sends the next message: null for both sides, or the side being corrected.
  let target = null;

  function setStatus(text, isError) {
    statusLine.textContent = text;
    statusLine.classList.toggle("error", Boolean(isError));
  }

  // An error stops applying once the server accepts the voter's next action.
  function clearError() {
    if (statusLine.classList.contains("error")) { setStatus(""); }
  }

  function socketUrl() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    return scheme + "://" + location.host + "/ws/battle/" + (battleId ? battleId + "/" : "");
  }

  function connect() {
    socket = new WebSocket(socketUrl());
    socket.addEventListener("open", function () {
      retryDelay = 500;
      setStatus("");
      const queued = unsent;
      unsent = [];
      queued.forEach(function (frame) { socket.send(JSON.stringify(frame)); });
    });
    socket.addEventListener("message", function (event) {
      lastFrameAt = Date.now();
      handle(JSON.parse(event.data));
    });
    socket.addEventListener("close", function (event) {
      if (event.code >= 4400) { return; }  // refused for good (no session, unknown battle)
      setStatus("Connection lost; reconnecting…", true);
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    });
  }

  function send(frame) {
    if (socket && socket.readyState === WebSocket.CONNECTING && unsent.length < 8) {
      unsent.push(frame);
      return true;
    }
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      setStatus("Not connected yet; try again in a moment.", true);
      return false;
    }
    socket.send(JSON.stringify(frame));
    return true;
  }

  function addMessage(side, role, text) {
    const element = document.createElement("div");
    element.className = "msg " + role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Model " + sideName(side);
    const textNode = document.createElement("div");
    textNode.className = "text";
    textNode.textContent = window.ArenaMarkdown.inert(text);
    element.append(who, textNode);
    logs[side].appendChild(element);
    return { element: element, textNode: textNode, who: who };
  }

  // corrects: the prompt it answers corrects this side's reply before, should that be judged
  // wrong (sent to this side alone, or a scripted correction): only then can it be 🥦.
  function addReply(turn, side, reply, corrects) {
    const view = addMessage(side, "assistant", "");
    const badge = document.createElement("span");
    badge.className = "reply-status";
    badge.setAttribute("role", "status");
    view.who.after(badge);
    const entry = {
      element: view.element, textNode: view.textNode, badge: badge, text: reply.text || "",
      seq: reply.seq || 0, status: reply.status, rating: reply.rating || null, turn: turn, side: side,
      ratingBar: null, stats: null, retry: null, verdict: reply.check ? reply.check.verdict : null,
      corrects: Boolean(corrects), cut: Boolean(reply.cut),
    };
    replies[turn + ":" + side] = entry;
    lastTurnOf[side] = Math.max(lastTurnOf[side], turn);
    paint(entry);
    showStatus(entry);
    if (isFinished(reply)) { finishReply(entry, reply); }
    if (reply.check) { showCheck(entry, reply.check); }
    return entry;
  }

  function paint(entry) {
    window.ArenaMarkdown.renderInto(entry.textNode, entry.text);
  }

  // Pending, streaming, stopped, failed and done replies each look different and say so.
  function showStatus(entry) {
    const status = entry.status || "pending";
    FINISHED.concat(["pending", "streaming"]).forEach(function (name) {
      entry.element.classList.toggle("is-" + name, name === status);
    });
    let text = STATUS_TEXT[status] || "";
    if (status === "stopped" && !entry.text.trim()) { text = "Stopped before it wrote anything"; }
    // Its cap (tokens or seconds) ended it, not its model: the same words for both caps, which
    // are the arena's in anonymous battles.
    if (status === "done" && entry.cut) { text = "Cut at the reply limit"; }
    entry.badge.textContent = text;
    entry.badge.hidden = !text;
    entry.element.setAttribute("aria-busy", String(status === "pending" || status === "streaming"));
  }

  function isFinished(entry) {
    return Boolean(entry) && FINISHED.indexOf(entry.status) >= 0;
  }

  function finishReply(entry, frame) {
    entry.status = frame.status;
    entry.cut = Boolean(frame.cut);
    entry.text = frame.text;
    paint(entry);
    showStatus(entry);
    if (entry.stats) { entry.stats.remove(); }
    const stats = document.createElement("small");
    stats.className = "stats";
    const s = frame.stats || {};
    if (frame.status === "failed") {
      stats.textContent = frame.error || "This reply failed.";
      stats.setAttribute("role", "alert");
    } else {
      stats.textContent = [
        s.tokens != null ? s.tokens + " tokens" : "",
        s.tokens_per_s ? s.tokens_per_s + " tok/s" : "",
        s.ttft_ms != null ? "first token " + s.ttft_ms + " ms" : "",
      ].filter(Boolean).join(" · ");
    }
    entry.element.appendChild(stats);
    entry.stats = stats;
    // A reply stopped before its first word has nothing to rate.
    if (frame.status === "failed") { addRetryButton(entry); } else if (frame.text.trim()) { addRatingBar(entry); }
  }

  function addRetryButton(entry) {
    if (entry.retry) { entry.retry.remove(); }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "retry";
    button.textContent = "Retry";
    button.title = "Generate this reply again";
    button.addEventListener("click", function () { send({ type: "regenerate", side: entry.side }); });
    entry.element.appendChild(button);
    entry.retry = button;
  }

  function addRatingBar(entry) {
    if (entry.ratingBar) { entry.ratingBar.remove(); }
    const bar = document.createElement("div");
    bar.className = "ratings";
    RATINGS.forEach(function (rating) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = rating[1];
      button.title = "Rate this reply: " + rating[2];
      button.setAttribute("aria-label", rating[3]);
      button.setAttribute("aria-pressed", "false");
      button.dataset.rating = rating[0];
      button.addEventListener("click", function () {
        const next = entry.rating === rating[0] ? null : rating[0];
        send({ type: "rate", side: entry.side, turn: entry.turn, rating: next });
        // A wrong latest reply: the next message is most likely its correction.
        if (WRONG.indexOf(next) >= 0 && entry.turn === lastTurnOf[entry.side]) { aimAt(entry.side); }
      });
      bar.appendChild(button);
    });
    entry.element.appendChild(bar);
    entry.ratingBar = bar;
    showRating(entry);
  }

  // Whether this reply answers a correction: its prompt corrects (see addReply) and the side's
  // reply before was judged wrong (rated or checked so). Only then can it be 🥦, as the server rules.
  function answersACorrection(entry) {
    if (!entry.corrects) { return false; }
    let previous = null;
    Object.keys(replies).forEach(function (key) {
      const other = replies[key];
      if (other.side === entry.side && other.turn < entry.turn && (!previous || other.turn > previous.turn)) {
        previous = other;
      }
    });
    return Boolean(previous) && (WRONG.indexOf(previous.rating) >= 0 || WRONG.indexOf(previous.verdict) >= 0);
  }

  function showRating(entry) {
    if (!entry.ratingBar) { return; }
    const fixable = answersACorrection(entry);
    Array.from(entry.ratingBar.children).forEach(function (button) {
      const chosen = button.dataset.rating === entry.rating;
      button.classList.toggle("chosen", chosen);
      button.setAttribute("aria-pressed", String(chosen));
      // After the reveal only the rating given stays, as a record; 🥦 only answers a mistake.
      button.hidden = ended ? !chosen : (button.dataset.rating === "fixed" && !fixable && !chosen);
      button.disabled = ended;
    });
  }

  function showCheck(entry, check) {
    const note = document.createElement("small");
    note.className = "check " + check.verdict;
    note.textContent = "Automatic check: " + check.verdict + (check.reason ? " — " + check.reason : "");
    entry.element.appendChild(note);
  }

  function aimAt(side) {
    target = side;
    refreshControls();
    input.focus();
  }

  function sideName(side) { return side.toUpperCase(); }

  function otherSide(side) { return side === "a" ? "b" : "a"; }

  function busy() {
    return Object.keys(replies).some(function (key) { return !isFinished(replies[key]); });
  }

  function sideBusy(side) {
    const last = replies[lastTurnOf[side] + ":" + side];
    return Boolean(last) && !isFinished(last);
  }

  // Every disabled control says why, in place and in its tooltip, before it is pressed.
  function explainDisabled(started, waiting, firstVoted, direct) {
    let why = "";
    if (ended || !started) {
      why = "";
    } else if (waiting && direct) {
      why = "Sending waits until the reply is finished; Stop ends it now.";
    } else if (waiting && !firstVoted) {
      why = "Voting opens when both replies are finished (Stop ends one now); a finished reply can be rated already.";
    } else if (waiting) {
      why = "Sending to both, voting and ending wait until both replies are finished; a finished side can be " +
        "rated and corrected alone already, and Stop ends the other.";
    } else if (!firstVoted && !direct) {
      why = "Say which side did better on the first try: sending more and ending wait for that vote.";
    }
    whyLine.textContent = why;
    whyLine.hidden = !why;
    [sendButton, toBothButton, endButton].concat(sendOneButtons, voteButtons).forEach(function (button) {
      if (button.disabled && why) { button.title = why; } else { button.removeAttribute("title"); }
    });
  }

  function canVoteAfterFix() {
    return Boolean(votes.first_try) && !votes.after_fix && latestTurn > (votes.first_try_turn || 0);
  }

  function refreshControls() {
    const started = latestTurn >= 0;
    const waiting = busy();
    const firstVoted = Boolean(votes.first_try);
    const direct = mode === "direct";
    const voteOpen = started && !waiting && !ended && (!firstVoted || canVoteAfterFix());
    showNames();
    votesBox.hidden = direct || ended;
    document.querySelector('.pane[data-side="b"]').hidden = direct;
    document.querySelector(".panes").classList.toggle("single", direct);
    // After the reveal nothing can act any more: the controls go, the record stays.
    voteButtons.forEach(function (button) { button.disabled = !voteOpen; button.hidden = ended; });
    endButton.hidden = ended;
    form.hidden = ended;
    if (ended) {
      voteStage.textContent = "Battle ended.";
    } else if (!firstVoted) {
      voteStage.textContent = "Which side did better on the first try?";
    } else if (votes.after_fix) {
      voteStage.textContent = "Thanks for voting. End the battle to see the names.";
    } else {
      voteStage.textContent = canVoteAfterFix()
        ? "And after the fix?"
        : "Correct a side that got it wrong (send to it only), then vote again — or end the battle.";
    }
    const cast = [];
    if (votes.first_try) { cast.push("first try: " + CHOICES[votes.first_try]); }
    if (votes.after_fix) { cast.push("after the fix: " + CHOICES[votes.after_fix]); }
    yourVotes.hidden = cast.length === 0;
    yourVotes.textContent = "Your votes — " + cast.join("; ") + ".";
    Object.keys(replies).forEach(function (key) { showRating(replies[key]); });
    endButton.disabled = ended || waiting || !firstVoted;
    const mayPrompt = !ended && !waiting && (!started || firstVoted || direct);
    // A side whose reply is finished can be corrected alone while the other still writes.
    const mayPromptTo = function (side) { return !ended && started && !sideBusy(side) && (firstVoted || direct); };
    sendButton.disabled = target ? !mayPromptTo(target) : !mayPrompt;
    sendOneButtons.forEach(function (button) {
      button.disabled = !mayPromptTo(button.dataset.side);
      button.hidden = direct;
    });
    input.disabled = ended;
    explainDisabled(started, waiting, firstVoted, direct);
    stopButton.hidden = ended || !waiting;
    // Only a side's latest reply can be retried.
    Object.keys(replies).forEach(function (key) { if (replies[key].retry) { replies[key].retry.hidden = true; } });
    SIDES.forEach(function (side) {
      const last = replies[lastTurnOf[side] + ":" + side];
      document.querySelector('.stop-side[data-side="' + side + '"]').hidden = !last || isFinished(last);
      const regenerate = document.querySelector('.regenerate[data-side="' + side + '"]');
      regenerate.disabled = ended || !last || !isFinished(last);
      regenerate.hidden = ended;
      if (last && last.retry) { last.retry.hidden = regenerate.disabled; }
    });
    showTarget(started);
    startPanel.hidden = Boolean(battleId) || started;
    taskPanel.hidden = !task;
    refreshSuggestions(mayPrompt);
  }

  // The input always says where the next message goes; a side left out says it waits, and why.
  function showTarget(started) {
    if (!started || mode === "direct") { target = null; }  // The first prompt goes to both sides.
    const to = target ? sideName(target) : "";
    targetLine.textContent = target ? "To " + to + " only — " + sideName(otherSide(target)) + " waits" : "To both sides";
    targetLine.hidden = ended;
    sendButton.textContent = target ? "Send to " + to + " only" : "Send to both";
    if (mode === "direct") {
      targetLine.textContent = "To " + (names && names.a ? names.a : "the model you picked");
      sendButton.textContent = "Send";
    }
    toBothButton.hidden = ended || !target;
    toBothButton.disabled = sendButton.disabled;
    input.placeholder = target ? "Tell " + to + " what's wrong…" : "Type a prompt…";
    SIDES.forEach(function (side) {
      const note = document.querySelector('.paused-note[data-side="' + side + '"]');
      const waits = !ended && target === otherSide(side);
      let text = "";
      if (!ended && started && lastTurnOf[side] < latestTurn) {
        text = "Paused: the last message went to " + sideName(otherSide(side)) + " only" +
          (waits ? ", and so will the next." : ".");
      } else if (waits) {
        text = "Waiting: your next message goes to " + sideName(target) + " only.";
      }
      note.textContent = text;
      note.hidden = !text;
      note.closest(".pane").classList.toggle("paused", Boolean(text));
      const last = replies[lastTurnOf[side] + ":" + side];
      const tell = document.querySelector('.tell-side[data-side="' + side + '"]');
      tell.hidden = ended || mode === "direct" || !last || !isFinished(last) || target === side;
    });
  }

  function refreshSuggestions(mayPrompt) {
    Array.from(suggestions.children).forEach(function (button, index) {
      const next = Math.max(scriptedSent.a, scriptedSent.b);
      button.classList.toggle("next", index === next);
      button.classList.toggle("sent", index < next);
      button.disabled = !mayPrompt;
    });
  }

  function renderTask(summary) {
    task = summary;
    suggestions.textContent = "";
    if (!task) { return; }
    document.getElementById("task-title").textContent = task.title;
    document.getElementById("task-system").textContent = task.system_prompt || "(no system prompt)";
    // A promoted mistake: the conversation the first scripted prompt corrects.
    const context = document.getElementById("task-context");
    context.textContent = "";
    (task.context || []).forEach(function (item) {
      const line = document.createElement("li");
      const who = document.createElement("strong");
      who.textContent = item.role === "user" ? "User: " : "Model: ";
      const text = document.createElement("pre");
      text.textContent = item.content;
      line.append(who, text);
      context.appendChild(line);
    });
    document.getElementById("task-context-box").hidden = !(task.context && task.context.length);
    task.suggestions.forEach(function (prompt, index) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "suggestion";
      button.textContent = (index + 1) + ". " + prompt;
      button.addEventListener("click", function () { input.value = prompt; input.focus(); });
      suggestions.appendChild(button);
    });
  }

  function renderTasks(tasks) {
    if (!tasks) { return; }  // Only a page without a battle lists them.
    taskList.textContent = "";
    tasks.forEach(function (item) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.task = item.slug;
      button.textContent = item.title + (item.category ? " (" + item.category + ")" : "");
      taskList.appendChild(button);
    });
  }

  function countScripted(side, text) {
    if (!task) { return; }
    const index = scriptedSent[side];
    if (index < task.suggestions.length && task.suggestions[index].trim() === text.trim()) {
      scriptedSent[side] = index + 1;
    }
  }

  function renderState(state) {
    SIDES.forEach(function (side) { logs[side].textContent = ""; });
    replies = {};
    latestTurn = -1;
    lastTurnOf = { a: -1, b: -1 };
    scriptedSent = { a: 0, b: 0 };
    renderTask(state.task);
    renderTasks(state.tasks);
    state.turns.forEach(function (turn) {
      latestTurn = turn.turn;
      turn.sides.forEach(function (side) {
        addMessage(side, "user", turn.prompt);
        countScripted(side, turn.prompt);
        if (turn.replies[side]) {
          addReply(turn.turn, side, turn.replies[side], (turn.corrects || []).indexOf(side) >= 0);
        }
      });
    });
    votes = Object.assign({}, state.votes || {});
    if (votes.first_try) { votes.first_try_turn = state.first_try_turn; }
    ended = Boolean(state.ended);
    mode = state.mode || mode;
    names = state.models || null;
    if (ended) { reveal(state); }
  }

  // The names: at the reveal in an anonymous battle, from the start in the modes where the voter
  // picked the models.
  function showNames() {
    SIDES.forEach(function (side) {
      const heading = document.querySelector('.pane[data-side="' + side + '"] h2');
      heading.textContent = "Model " + sideName(side) + (names && names[side] ? ": " + names[side] : "");
    });
  }

  function reveal(state) {
    ended = true;
    endedNote.hidden = false;
    if (mode === "direct") {
      endedNote.textContent = "Chat ended.";
    } else if (mode === "named") {
      endedNote.textContent = "Battle ended. Named battles stay off the leaderboard; your votes are kept with their mode.";
    } else {
      endedNote.textContent = state.ended_by === "idle"
        ? "This battle ended by itself after you voted and went quiet, so your votes count. Here is who was who."
        : "Battle ended: your votes count. Here is who was who.";
    }
    shareLine.hidden = !state.share;
    if (state.share) {
      shareLink.href = state.share;
      shareLink.textContent = location.origin + state.share;
    }
    if (state.excluded && mode === "anonymous") {
      excludedLine.hidden = false;
      excludedLine.textContent = "This battle does not count on the leaderboard: " + state.excluded + ".";
    }
    setStatus("Thanks! Start a new battle to go on.");
  }

  function handle(frame) {
    switch (frame.type) {
      case "state":
        renderState(frame);
        break;
      case "battle":
        battleId = frame.battle;
        history.replaceState(null, "", "/battle/" + battleId + "/");
        break;
      case "prompt":
        if (sentPrompt !== null && input.value.trim() === sentPrompt) { input.value = ""; }
        sentPrompt = null;
        clearError();
        latestTurn = frame.turn;
        frame.sides.forEach(function (side) {
          addMessage(side, "user", frame.text);
          countScripted(side, frame.text);
          addReply(frame.turn, side, { text: "", seq: 0, status: "pending" }, (frame.corrects || []).indexOf(side) >= 0);
        });
        break;
      case "delta": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (!entry || frame.seq < entry.seq) { break; }  // already part of the state we have
        if (frame.seq > entry.seq) { send({ type: "sync" }); break; }  // a gap: resync
        entry.text += frame.text;
        entry.seq += 1;
        paint(entry);
        logs[frame.side].scrollTop = logs[frame.side].scrollHeight;
        if (entry.status !== "streaming") { entry.status = "streaming"; showStatus(entry); }
        break;
      }
      case "end": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (entry && !isFinished(entry)) { finishReply(entry, frame); }
        break;
      }
      case "restart":  // A worker was lost: the reply is generated again from the start.
      case "regenerating": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (frame.type === "regenerating") { clearError(); }
        if (entry) {
          entry.text = "";
          paint(entry);
          entry.seq = 0;
          entry.status = "pending";
          showStatus(entry);
          entry.rating = null;
          ["ratingBar", "stats", "retry"].forEach(function (name) {
            if (entry[name]) { entry[name].remove(); entry[name] = null; }
          });
        }
        break;
      }
      case "rated": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (entry) { entry.rating = frame.rating; }
        clearError();
        break;
      }
      case "voted":
        clearError();
        votes[frame.stage] = frame.choice;
        if (frame.stage === "first_try") { votes.first_try_turn = frame.after_turn; }
        break;
      case "revealed":
        renderState(frame);
        break;
      case "error":
        sentPrompt = null;  // Refused: the text stays in the box to be sent again.
        setStatus(frame.message, true);
        break;
    }
    refreshControls();
  }

  // A named battle or direct chat starts with the models picked on the page.
  function startFrame(taskSlug) {
    const frame = { type: "start" };
    if (taskSlug) { frame.task = taskSlug; }
    if (pageMode) {
      frame.mode = pageMode;
      frame.models = pageMode === "named" ? [pickA.value, pickB.value] : [pickA.value];
    }
    return frame;
  }

  function submitPrompt(side) {
    const text = input.value.trim();
    if (!text) { setStatus("Type a prompt first.", true); return; }
    // The anonymous arena starts with the first prompt; the other modes with the models picked.
    if (!battleId && latestTurn < 0 && pageMode) {
      if (pageMode === "named" && pickA.value === pickB.value) {
        setStatus("Pick two different models to compare.", true);
        return;
      }
      if (!send(startFrame(null))) { return; }
    }
    const frame = { type: "prompt", text: text };
    if (side) { frame.side = side; }
    if (send(frame)) { sentPrompt = text; }
  }

  form.addEventListener("submit", function (event) { event.preventDefault(); submitPrompt(target); });
  toBothButton.addEventListener("click", function () { target = null; refreshControls(); input.focus(); });
  tellButtons.forEach(function (button) {
    button.addEventListener("click", function () { aimAt(button.dataset.side); });
  });
  sendOneButtons.forEach(function (button) {
    button.addEventListener("click", function () { submitPrompt(button.dataset.side); });
  });
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  stopButton.addEventListener("click", function () { send({ type: "stop" }); });
  stopSideButtons.forEach(function (button) {
    button.addEventListener("click", function () { send({ type: "stop", side: button.dataset.side }); });
  });
  regenerateButtons.forEach(function (button) {
    button.addEventListener("click", function () { send({ type: "regenerate", side: button.dataset.side }); });
  });
  voteButtons.forEach(function (button) {
    button.addEventListener("click", function () { send({ type: "vote", choice: button.dataset.choice }); });
  });
  endButton.addEventListener("click", function () { send({ type: "end" }); });
  document.getElementById("free-chat").addEventListener("click", function () { send(startFrame(null)); });
  taskList.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-task]");
    if (button) { send(startFrame(button.dataset.task)); }
  });
  document.getElementById("copy-share").addEventListener("click", function () {
    const button = this;
    window.ArenaMarkdown.copyText(shareLink.href).then(
      function () { button.textContent = "Copied"; },
      function () { button.textContent = "Select the link to copy it"; },
    );
  });

  // A worker lost mid-reply, or frames lost while Redis restarted: a busy page that hears
  // nothing for a while asks for the state (the server fails replies whose worker is gone).
  setInterval(function () {
    if (busy() && Date.now() - lastFrameAt > QUIET_RESYNC_MS && send({ type: "sync" })) {
      lastFrameAt = Date.now();
    }
  }, 1000);

  // While models warm (the server started a moment ago), the fresh page says how many are
  // ready and enables each picker entry as its model becomes ready.
  const rosterLine = document.getElementById("roster");
  function rosterText(roster) {
    if (roster.ready === roster.total) { return "All " + roster.total + " models are ready."; }
    if (roster.battles_possible) {
      return roster.ready + " of " + roster.total + " models are ready, and battles draw among them; the others are warming up.";
    }
    return "Warming up: " + roster.ready + " of " + roster.total + " models are ready, and a battle needs " +
      roster.needed + ". This line says when they are.";
  }
  function watchRoster() {
    fetch(rosterLine.dataset.url, { headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (roster) {
        if (roster) {
          rosterLine.textContent = rosterText(roster);
          roster.models.forEach(function (model) {
            [pickA, pickB].forEach(function (select) {
              const option = select && Array.from(select.options).find(function (o) { return o.value === model.name; });
              if (!option) { return; }
              option.disabled = model.state !== "ready";
              option.textContent = model.name + (model.state === "ready" ? "" : " (" + model.state + ")");
            });
          });
          if (roster.models.every(function (m) { return m.state === "ready"; })) { return; }
        }
        setTimeout(watchRoster, ROSTER_POLL_MS);
      }, function () { setTimeout(watchRoster, ROSTER_POLL_MS); });
  }
  if (rosterLine && rosterLine.hasAttribute("data-watch")) { setTimeout(watchRoster, ROSTER_POLL_MS); }

  refreshControls();
  connect();
})();
