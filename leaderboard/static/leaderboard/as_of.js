// Picking another "As of" refresh shows it at once (the policy allows no inline handler; without
// script, the form's Show button does the same).
"use strict";
document.querySelectorAll("form.as-of select[name=refresh]").forEach((select) => {
  select.addEventListener("change", () => select.form.submit());
});
