// An evaluation run's page follows the run while it waits or runs: status, steps done of the
// total and an estimate of the time left, from its progress URL every two seconds. Once the run
// has ended, the page reloads once to show its results (or says why it stopped).
(function () {
  "use strict";
  const section = document.getElementById("run-progress");
  if (!section || !section.hasAttribute("data-live")) return;
  const url = section.getAttribute("data-progress-url");
  const status = document.getElementById("run-status");
  const steps = document.getElementById("run-steps");
  const left = document.getElementById("run-left");
  const bar = document.getElementById("run-bar");
  const cancel = document.getElementById("cancel-run");

  function duration(seconds) {
    if (seconds < 90) return `${seconds} s`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
    return `${(seconds / 3600).toFixed(1)} h`;
  }

  function show(run) {
    status.textContent = run.status_label;
    steps.textContent = `${run.progress} of ${run.total}`;
    left.textContent = run.seconds_left === null ? "" : `, about ${duration(run.seconds_left)} left`;
    bar.max = Math.max(run.total, 1);
    bar.value = run.progress;
    bar.textContent = `${run.progress} of ${run.total}`;
  }

  async function poll() {
    let run;
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      run = await response.json();
    } catch (error) {
      left.textContent = ` (progress unavailable: ${error.message}; retrying)`;
      setTimeout(poll, 5000);
      return;
    }
    show(run);
    if (run.unfinished) {
      setTimeout(poll, 2000);
      return;
    }
    if (cancel) cancel.remove();
    section.removeAttribute("data-live");
    window.location.reload();
  }

  setTimeout(poll, 2000);
})();
