typedef int gang__placeholder_885;
