// A time of day as the page and the dashboard show every one: the computer's own clock,
// 24-hour HH:MM:SS, as `join` stamps its lines (the page's Messages showed UTC from the ISO
// stamp, and its waiting line a 12-hour local time beside it).
export function clock(date) {
  return [date.getHours(), date.getMinutes(), date.getSeconds()]
    .map((n) => String(n).padStart(2, "0")).join(":");
}
