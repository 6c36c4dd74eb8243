// The arena's websocket client. Plain JavaScript, no build step. Frames: docs/protocol.md.
// Model output is always inserted with textContent, never as HTML.
(function () {
  "use strict";

  const root = document.getElementById("arena");
  const form = document.getElementById("prompt-form");
  const input = document.getElementById("prompt");
  const sendButton = document.getElementById("send");
  const stopButton = document.getElementById("stop");
  const statusLine = document.getElementById("status");
  const voteButtons = Array.from(document.querySelectorAll("#votes button"));
  const logs = { a: document.getElementById("log-a"), b: document.getElementById("log-b") };

  let battleId = root.dataset.battle || "";
  let socket = null;
  let retryDelay = 500;
  // replies["<turn>:<side>"] = {element, textNode, seq (next expected delta), status}
  let replies = {};
  let latestTurn = -1;
  let voted = false;

  function setStatus(text, isError) {
    statusLine.textContent = text;
    statusLine.classList.toggle("error", Boolean(isError));
  }

  function socketUrl() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    return scheme + "://" + location.host + "/ws/battle/" + (battleId ? battleId + "/" : "");
  }

  function connect() {
    socket = new WebSocket(socketUrl());
    socket.addEventListener("open", function () { retryDelay = 500; setStatus(""); });
    socket.addEventListener("message", function (event) { handle(JSON.parse(event.data)); });
    socket.addEventListener("close", function (event) {
      if (event.code >= 4400) { return; }  // refused for good (no session, unknown battle)
      setStatus("Connection lost; reconnecting…", true);
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    });
  }

  function send(frame) {
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
    const textNode = document.createElement("span");
    textNode.className = "text";
    textNode.textContent = text;
    element.appendChild(textNode);
    logs[side].appendChild(element);
    return { element: element, textNode: textNode };
  }

  function addReply(turn, side, reply) {
    const view = addMessage(side, "assistant", reply.text || "");
    const entry = { element: view.element, textNode: view.textNode, seq: reply.seq || 0, status: reply.status };
    replies[turn + ":" + side] = entry;
    if (isFinished(reply)) { finishReply(entry, reply); }
    return entry;
  }

  const FINISHED = ["done", "stopped", "failed"];

  function isFinished(entry) {
    return Boolean(entry) && FINISHED.indexOf(entry.status) >= 0;
  }

  function finishReply(entry, frame) {
    entry.status = frame.status;
    entry.textNode.textContent = frame.text;
    if (frame.status === "failed") {
      entry.element.classList.add("failed");
    }
    const stats = document.createElement("small");
    stats.className = "stats";
    const s = frame.stats || {};
    if (frame.status === "failed") {
      stats.textContent = frame.error || "This reply failed.";
    } else {
      stats.textContent = [
        frame.status === "stopped" ? "stopped" : "",
        s.tokens != null ? s.tokens + " tokens" : "",
        s.tokens_per_s ? s.tokens_per_s + " tok/s" : "",
        s.ttft_ms != null ? "first token " + s.ttft_ms + " ms" : "",
      ].filter(Boolean).join(" · ");
    }
    entry.element.appendChild(stats);
  }

  function allRepliesFinished() {
    if (latestTurn < 0) { return false; }
    return ["a", "b"].every(function (side) { return isFinished(replies[latestTurn + ":" + side]); });
  }

  function refreshControls() {
    const ready = allRepliesFinished();
    voteButtons.forEach(function (button) { button.disabled = voted || !ready; });
    sendButton.disabled = voted || (latestTurn >= 0 && !ready);
    stopButton.hidden = voted || latestTurn < 0 || ready;
    input.disabled = voted;
  }

  function renderState(state) {
    logs.a.textContent = "";
    logs.b.textContent = "";
    replies = {};
    latestTurn = -1;
    state.turns.forEach(function (turn) {
      latestTurn = turn.turn;
      ["a", "b"].forEach(function (side) {
        addMessage(side, "user", turn.prompt);
        if (turn.replies[side]) { addReply(turn.turn, side, turn.replies[side]); }
      });
    });
    voted = Boolean(state.vote);
    if (state.models) { reveal(state.vote, state.models); }
  }

  function reveal(choice, models) {
    voted = true;
    document.querySelector('.pane[data-side="a"] h2').textContent = "Model A: " + models.a;
    document.querySelector('.pane[data-side="b"] h2').textContent = "Model B: " + models.b;
    setStatus("Thanks for voting. Start a new battle to go on.");
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
        latestTurn = frame.turn;
        ["a", "b"].forEach(function (side) {
          addMessage(side, "user", frame.text);
          addReply(frame.turn, side, { text: "", seq: 0, status: "pending" });
        });
        break;
      case "delta": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (!entry || frame.seq < entry.seq) { break; }  // already part of the state we have
        if (frame.seq > entry.seq) { send({ type: "sync" }); break; }  // a gap: resync
        entry.textNode.textContent += frame.text;
        entry.seq += 1;
        logs[frame.side].scrollTop = logs[frame.side].scrollHeight;
        entry.status = "streaming";
        break;
      }
      case "end": {
        const entry = replies[frame.turn + ":" + frame.side];
        if (entry && !isFinished(entry)) { finishReply(entry, frame); }
        break;
      }
      case "restart": {
        // A worker was lost and the reply is generated again from the start.
        const entry = replies[frame.turn + ":" + frame.side];
        if (entry && !isFinished(entry)) { entry.textNode.textContent = ""; entry.seq = 0; }
        break;
      }
      case "revealed":
        reveal(frame.vote, frame.models);
        break;
      case "error":
        setStatus(frame.message, true);
        break;
    }
    refreshControls();
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) { setStatus("Type a prompt first.", true); return; }
    if (send({ type: "prompt", text: text })) { input.value = ""; setStatus(""); }
  });
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
  });
  stopButton.addEventListener("click", function () { send({ type: "stop" }); });
  voteButtons.forEach(function (button) {
    button.addEventListener("click", function () { send({ type: "vote", choice: button.dataset.choice }); });
  });

  refreshControls();
  connect();
})();
